// PowerSGD's rounds algorithm on comm/local ranks (threads): tests/comm/powersgd_check.h on 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include "tests/comm/local_harness.h"
#include "tests/comm/powersgd_check.h"

namespace gradcomp {
namespace {

TEST(PowerSgdLocal, MatchesTheReferenceOnEveryRank) {
  for (int ranks : {1, 2, 4}) {
    testing::run_ranks(ranks, [](Communicator& comm) {
      testing::check_powersgd_steps(comm, 40, 64, 1, ReduceOp::kAverage);
      testing::check_powersgd_steps(comm, 33, 70, 4, ReduceOp::kAverage);
      testing::check_powersgd_steps(comm, 50, 20, 2, ReduceOp::kSum);
    });
  }
}

TEST(PowerSgdLocal, FusedSegmentsEqualSeparateCalls) {
  testing::run_ranks(3, [](Communicator& comm) { testing::check_powersgd_fused_equals_separate(comm); });
}

TEST(PowerSgdLocal, ChunkedAlgorithmsRefuseMatrices) {
  testing::run_ranks(2, [](Communicator& comm) {
    auto codec = make_compressor("powersgd");
    std::vector<float> tensor(64 * 64, 1.0f);
    AllreduceOptions options;
    options.algorithm = AllreduceAlgorithm::kScatterReduceAllgather;
    EXPECT_THROW(compressed_allreduce(comm, *codec, TensorView::of(std::span<float>(tensor)).with_rows(64), "w",
                                      options),
                 InvalidArgument);
  });
}

TEST(PowerSgdLocal, RanksThatDisagreeOnTheShapeFailOnEveryRankNamingIt) {
  const auto errors = testing::run_ranks_collect(2, [](Communicator& comm) {
    auto codec = make_compressor("powersgd");
    std::vector<float> tensor(64 * 64, 1.0f);
    compressed_allreduce(comm, *codec, TensorView::of(std::span<float>(tensor)).with_rows(comm.rank() ? 32 : 64),
                         "w");
  });
  for (const auto& error : errors) {
    ASSERT_TRUE(error);
    try {
      std::rethrow_exception(error);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rows=32"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gradcomp
