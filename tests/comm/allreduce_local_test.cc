// compressed_allreduce on comm/local: every algorithm x every registered codec x 1..4 ranks x awkward sizes against
// the reference rebuilt from every rank's input; agreement checks; dead ranks; hierarchical mode against its own
// reference (tests/comm/hierarchical_check.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <tuple>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "tests/comm/allreduce_check.h"
#include "tests/comm/hierarchical_check.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::check_allreduce;
using testing::run_ranks;
using testing::run_ranks_collect;

const AllreduceAlgorithm kAlgorithms[] = {AllreduceAlgorithm::kAuto, AllreduceAlgorithm::kDense,
                                          AllreduceAlgorithm::kAllgather, AllreduceAlgorithm::kSparseAllreduce,
                                          AllreduceAlgorithm::kScatterReduceAllgather};

class EveryCase : public ::testing::TestWithParam<std::tuple<int, AllreduceAlgorithm>> {};

TEST_P(EveryCase, MatchesReferenceOnEveryCodecAndSize) {
  const auto [ranks, algorithm] = GetParam();
  for (const std::string& spec : testing::registered_specs()) {
    const bool summable = make_compressor(spec)->traits().summable;
    if (algorithm == AllreduceAlgorithm::kDense && !summable) continue;  // rejected: tested below
    for (std::size_t numel : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001}, std::size_t{70001}}) {
      SCOPED_TRACE(fmt::format("spec {} numel {}", spec, numel));
      run_ranks(ranks, [&, algorithm = algorithm](Communicator& comm) {
        check_allreduce(comm, spec, algorithm, numel, 2);
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndAlgorithms, EveryCase,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::ValuesIn(kAlgorithms)),
                         [](const auto& info) {
                           return fmt::format("{}ranks_{}", std::get<0>(info.param),
                                              algorithm_name(std::get<1>(info.param)));
                         });

TEST(CompressedAllreduce, SumOpAndHalfTensors) {
  run_ranks(3, [](Communicator& comm) {
    for (auto algorithm : kAlgorithms) check_allreduce(comm, "none", algorithm, 999, 1, ReduceOp::kSum);
    // f16 tensor through the none codec: exact sums of small integers.
    std::vector<std::uint16_t> half(10, 0x3C00);  // 1.0
    auto codec = make_compressor("none");
    for (auto algorithm : kAlgorithms) {
      std::fill(half.begin(), half.end(), std::uint16_t{0x3C00});
      AllreduceOptions options;
      options.op = ReduceOp::kSum;
      options.algorithm = algorithm;
      compressed_allreduce(comm, *codec, TensorView(half.data(), half.size(), DType::kF16), "h", options);
      for (auto bits : half) EXPECT_EQ(bits, 0x4200) << algorithm_name(algorithm);  // 3.0
    }
  });
}

TEST(CompressedAllreduce, SparseSwitchesToDensePastTheThreshold) {
  run_ranks(3, [](Communicator& comm) {
    // `none` transmits everything: density ~1 per rank, sum 3 > 1.0: dense.
    auto stats = check_allreduce(comm, "none", AllreduceAlgorithm::kSparseAllreduce, 5000, 1);
    EXPECT_TRUE(stats.switched_to_dense);
    EXPECT_EQ(stats.union_nnz, 0u);
    // With a switch density of 10 it stays sparse.
    stats = check_allreduce(comm, "none", AllreduceAlgorithm::kSparseAllreduce, 5000, 1, ReduceOp::kAverage, 10.0);
    EXPECT_FALSE(stats.switched_to_dense);
    EXPECT_GT(stats.union_nnz, 4900u);
    EXPECT_LE(stats.union_nnz, 5000u);
  });
}

TEST(CompressedAllreduce, WireBytesFollowTheFormulas) {
  run_ranks(4, [](Communicator& comm) {
    auto codec = make_compressor("none");
    std::vector<float> x(1000, 1.0f);
    auto stats = compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "w");
    EXPECT_EQ(stats.algorithm, AllreduceAlgorithm::kDense);
    EXPECT_EQ(stats.wire_bytes, 2 * 4000 * 3 / 4);
    AllreduceOptions options;
    options.algorithm = AllreduceAlgorithm::kAllgather;
    stats = compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "w", options);
    EXPECT_EQ(stats.wire_bytes, (4 * stats.payload_bytes) * 3 / 4 + 8 * 3);
  });
}

TEST(CompressedAllreduce, DenseRejectsNonSummableCodecs) {
  for (const std::string& spec : testing::registered_specs()) {
    if (make_compressor(spec)->traits().summable) continue;
    run_ranks(2, [&](Communicator& comm) {
      auto codec = make_compressor(spec);
      std::vector<float> x(10, 1.0f);
      AllreduceOptions options;
      options.algorithm = AllreduceAlgorithm::kDense;
      EXPECT_THROW(compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "x", options), InvalidArgument);
    });
  }
}

// Every rank failed with InvalidArgument whose message holds every needle.
void expect_invalid_everywhere(const std::vector<std::exception_ptr>& errors, const std::vector<std::string>& needles) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      for (const std::string& needle : needles) EXPECT_NE(what.find(needle), std::string::npos) << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw something else: " << e.what();
    }
  }
}

// A mismatch raises InvalidArgument on every rank, naming both sides.
void expect_mismatch(const std::function<void(Communicator&, std::vector<float>&, std::string&, std::string&)>& tweak,
                     const std::string& needle_a, const std::string& needle_b) {
  auto errors = run_ranks_collect(3, [&](Communicator& comm) {
    std::vector<float> x(100, 1.0f);
    std::string name = "layer.weight", spec = "none";
    tweak(comm, x, name, spec);
    auto codec = make_compressor(spec);
    compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), name);
  });
  expect_invalid_everywhere(errors, {needle_a, needle_b, "rank 2"});
}

TEST(CompressedAllreduce, MismatchedNameNumelOrSpecRaisesEverywhere) {
  expect_mismatch([](Communicator& c, auto&, std::string& name, auto&) { if (c.rank() == 2) name = "layer.bias"; },
                  "name='layer.weight'", "name='layer.bias'");
  expect_mismatch([](Communicator& c, std::vector<float>& x, auto&, auto&) { if (c.rank() == 2) x.resize(99); },
                  "numel=100", "numel=99");
  expect_mismatch([](Communicator& c, auto&, auto&, std::string& spec) { if (c.rank() == 2) spec = "none:nonfinite=skip"; },
                  "nonfinite=raise", "nonfinite=skip");
}

TEST(CompressedAllreduce, MismatchedSegmentsRaiseEverywhere) {
  // Same buffer, name and codec, but rank 2 cuts it into other tensors: the check compares the segments too.
  auto errors = run_ranks_collect(3, [&](Communicator& comm) {
    std::vector<float> x(100, 1.0f);
    const std::size_t cut = comm.rank() == 2 ? 70 : 30;
    std::vector<TensorSegment> segments = {{.name = "a", .offset = 0, .numel = cut},
                                           {.name = "b", .offset = cut, .numel = 100 - cut}};
    AllreduceOptions options;
    options.segments = segments;
    auto codec = make_compressor("topk:ratio=0.5");
    compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "bucket", options);
  });
  expect_invalid_everywhere(
      errors, {"name='bucket'", "segments=[a:30, b:70]", "rank 2 has", "segments=[a:70, b:30]"});
}

TEST(CompressedAllreduce, DeadRankMakesTheOthersFailWithinTheTimeout) {
  for (auto algorithm : kAlgorithms) {
    if (algorithm == AllreduceAlgorithm::kDense) continue;
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ranks_collect(
        3,
        [&](Communicator& comm) {
          auto codec = make_compressor("none");
          std::vector<float> x(1000, 1.0f);
          AllreduceOptions options;
          options.algorithm = algorithm;
          compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "ok", options);  // all three
          if (comm.rank() == 1) return;  // "dies": stops participating
          compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "second", options);
        },
        std::chrono::milliseconds(400));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 10.0) << algorithm_name(algorithm);
    for (int r : {0, 2}) {
      ASSERT_TRUE(errors[r]) << algorithm_name(algorithm) << " rank " << r;
      try {
        std::rethrow_exception(errors[r]);
      } catch (const Timeout&) {
      } catch (const CommError&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    }
  }
}

TEST(CompressedAllreduce, HierarchicalMatchesTheReferenceForEveryCodec) {
  // (world ranks, ranks per node): even nodes, a short last node, nodes of three.
  for (const auto& [world, per_node] : {std::pair{4, 2}, std::pair{5, 2}, std::pair{6, 3}}) {
    ::setenv("GRADCOMP_LOCAL_SIZE", std::to_string(per_node).c_str(), 1);
    run_ranks(world, [world = world, per_node = per_node](Communicator& comm) {
      NodeGroups groups = make_node_groups(comm);
      EXPECT_EQ(groups.node_count, (world + per_node - 1) / per_node);
      EXPECT_EQ(groups.node->size(), std::min(per_node, world - comm.rank() / per_node * per_node));
      EXPECT_EQ(groups.leaders != nullptr, comm.rank() % per_node == 0);
      for (const std::string& spec : testing::registered_specs()) {
        testing::check_hierarchical(comm, groups, spec, 32, 64);
      }
      testing::check_hierarchical(comm, groups, "topk:ratio=0.05", 1, 1001, 2, ReduceOp::kSum);
    });
  }
  ::unsetenv("GRADCOMP_LOCAL_SIZE");
}

TEST(CompressedAllreduce, RejectsBadArguments) {
  run_ranks(1, [](Communicator& comm) {
    auto codec = make_compressor("none");
    std::vector<float> x(4, 1.0f);
    EXPECT_THROW(compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), ""), InvalidArgument);
    AllreduceOptions options;
    options.op = ReduceOp::kMax;
    EXPECT_THROW(compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "x", options), InvalidArgument);
    std::int32_t i = 0;
    EXPECT_THROW(compressed_allreduce(comm, *codec, TensorView(&i, 1, DType::kI32), "x"), InvalidArgument);
  });
  EXPECT_EQ(parse_algorithm("sra"), AllreduceAlgorithm::kScatterReduceAllgather);
  EXPECT_THROW(parse_algorithm("ring"), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp
