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

TEST(PowerSgdLocal, HierarchicalRunsTheRoundsBetweenNodeLeaders) {
  // 4 ranks in 2 nodes: each node sums densely, the leaders reduce the node sums (divided by 4 for the average) in
  // rounds, so the result is PowerSGD over two "ranks" holding (g0 + g1) / 4 and (g2 + g3) / 4, summed.
  ::setenv("GRADCOMP_LOCAL_SIZE", "2", 1);
  const std::size_t rows = 24, cols = 36;
  testing::PowerSgdReference ref("w", rows, cols, 2, 2);
  std::vector<std::vector<double>> expected(3);
  for (std::uint64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> nodes(2, std::vector<float>(rows * cols, 0.0f));
    for (int r = 0; r < 4; ++r) {
      const auto g = testing::make_gradient(rows * cols, r, step, 3);
      for (std::size_t i = 0; i < g.size(); ++i) nodes[r / 2][i] += g[i];
    }
    for (auto& node : nodes) {
      for (float& v : node) v /= 4.0f;
    }
    expected[step] = ref.step(nodes, step, /*average=*/false);
  }
  testing::run_ranks(4, [&](Communicator& comm) {
    NodeGroups groups = make_node_groups(comm);
    auto codec = make_compressor("powersgd:rank=2");
    for (std::uint64_t step = 0; step < 3; ++step) {
      auto tensor = testing::make_gradient(rows * cols, comm.rank(), step, 3);
      AllreduceOptions options;
      options.hierarchical = true;
      options.nodes = &groups;
      options.step = step;
      compressed_allreduce(comm, *codec, TensorView::of(std::span<float>(tensor)).with_rows(rows), "w", options);
      EXPECT_LT(testing::relative_error(tensor, expected[step]), 1e-4) << "rank " << comm.rank() << " step " << step;
    }
  });
  ::unsetenv("GRADCOMP_LOCAL_SIZE");
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
