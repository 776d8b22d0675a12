// The hot path in steady state, through the host MemorySpace (which counts what the device space would do): after
// the first call of a shape, a compressed allreduce obtains no working memory from the system (pooled payload,
// gather, sum and counter blocks, small ones included) and waits for the device a fixed, small number of times per
// algorithm (AllreduceStats::allocations, ::synchronizations). On a GPU the same counts include the CUDA codecs'
// own waits and workspaces (device_path_gpu_test, device_path_bench).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

struct Case {
  std::string spec;
  AllreduceAlgorithm algorithm;
  bool segmented;
  // Waits of the algorithm per call: before a communicator reads device buffers, for a count read back (the sparse
  // union, a summable payload's header), and the one at the end of the call.
  std::size_t synchronizations;
  // Rank-ordered f32 sums per call (ordered_sum_f32: the rounds of PowerSGD, the sparse algorithm's dense switch):
  // with more than one rank each waits twice more (before its alltoallv and before its allgatherv).
  std::size_t ordered_sums = 0;
};

void run_steady(const Case& c, int ranks) {
  const std::size_t numel = 20000;
  const std::size_t waits = c.synchronizations + (ranks > 1 ? 2 * c.ordered_sums : 0);
  testing::run_ranks(ranks, [&](Communicator& comm) {
    auto codec = make_compressor(c.spec);
    const std::vector<TensorSegment> segments = {
        {"x", 0, 5000, 0, 5000, 50}, {"y", 5000, 15000, 0, 15000, 100}};
    std::vector<AllreduceStats> stats;
    for (std::uint64_t step = 0; step < 4; ++step) {
      std::vector<float> tensor(numel);
      for (std::size_t i = 0; i < numel; ++i) {
        tensor[i] = static_cast<float>((i * 7919 + step * 31 + static_cast<std::size_t>(comm.rank())) % 1000) - 500.0f;
      }
      AllreduceOptions options;
      options.algorithm = c.algorithm;
      options.step = step;
      if (c.segmented) options.segments = segments;
      stats.push_back(compressed_allreduce(comm, *codec, TensorView::of(std::span(tensor)).with_rows(200), "t",
                                           options));
    }
    if (c.algorithm != AllreduceAlgorithm::kRounds) {  // rounds keeps its buffers in the codec's own state
      EXPECT_GT(stats[0].allocations, 0u) << "the first call fills the pools (else the counter counts nothing)";
    }
    for (std::size_t s = 1; s < stats.size(); ++s) {
      EXPECT_EQ(stats[s].allocations, 0u) << "step " << s << " rank " << comm.rank();
      EXPECT_EQ(stats[s].synchronizations, waits) << "step " << s << " rank " << comm.rank();
    }
  });
}

TEST(SteadyState, NoAllocationAndFixedWaitsPerAlgorithm) {
  const std::vector<Case> cases = {
      {"fp16", AllreduceAlgorithm::kDense, false, 2},                      // header read, end
      {"fp16", AllreduceAlgorithm::kDense, true, 2},
      {"topk:ratio=0.01", AllreduceAlgorithm::kAllgather, false, 2},       // before the gather, end
      {"topk:ratio=0.01,values=f16", AllreduceAlgorithm::kSparseAllreduce, true, 3},  // + the union count
      {"randomk:ratio=0.01", AllreduceAlgorithm::kSparseAllreduce, false, 3},
      {"dgc:ratio=0.01", AllreduceAlgorithm::kSparseAllreduce, true, 3},
      {"blocktopk:ratio=0.05,block=16", AllreduceAlgorithm::kAllgather, false, 2},
      {"qsgd:bits=4", AllreduceAlgorithm::kScatterReduceAllgather, false, 3},  // before alltoallv and gather, end
      {"onebit", AllreduceAlgorithm::kScatterReduceAllgather, true, 3},
      {"terngrad", AllreduceAlgorithm::kAllgather, false, 2},
      {"powersgd:rank=2", AllreduceAlgorithm::kRounds, true, 1, 2},         // end; two rounds, each an ordered sum
  };
  for (const Case& c : cases) {
    for (const int ranks : {1, 3}) {
      SCOPED_TRACE(fmt::format("{} over {}{}, {} ranks", c.spec, algorithm_name(c.algorithm),
                               c.segmented ? " (segmented)" : "", ranks));
      run_steady(c, ranks);
    }
  }
}

TEST(SteadyState, TheDenseSwitchStaysAllocationFree) {
  // topk at 60% density: the sparse algorithm switches to the rank-ordered f32 sum (no gather, no union count).
  run_steady({"topk:ratio=0.6", AllreduceAlgorithm::kSparseAllreduce, false, 1, 1}, 3);
}

// The runtime's buffers vary in size from step to step when a cycle groups the tensors differently: a call on a
// smaller tensor after one on a larger tensor reuses the larger call's blocks and obtains no memory.
TEST(SteadyState, ASmallerTensorAfterALargerOneAllocatesNothing) {
  const std::vector<std::pair<std::string, AllreduceAlgorithm>> cases = {
      {"fp16", AllreduceAlgorithm::kDense},
      {"topk:ratio=0.01", AllreduceAlgorithm::kAllgather},
      {"dgc:ratio=0.01", AllreduceAlgorithm::kSparseAllreduce},
      {"qsgd:bits=4", AllreduceAlgorithm::kScatterReduceAllgather}};
  for (const auto& [spec, algorithm] : cases) {
    SCOPED_TRACE(fmt::format("{} over {}", spec, algorithm_name(algorithm)));
    testing::run_ranks(3, [&](Communicator& comm) {
      auto codec = make_compressor(spec);
      AllreduceOptions options;
      options.algorithm = algorithm;
      std::vector<AllreduceStats> stats;
      for (const std::size_t numel : {std::size_t{1'500'000}, std::size_t{400'000}}) {
        std::vector<float> tensor(numel);
        for (std::size_t i = 0; i < numel; ++i) tensor[i] = static_cast<float>((i * 7919 + numel) % 1000) - 500.0f;
        stats.push_back(compressed_allreduce(comm, *codec, TensorView::of(std::span(tensor)),
                                             fmt::format("t{}", numel), options));
      }
      EXPECT_GT(stats[0].allocations, 0u) << "the first call fills the pools";
      EXPECT_EQ(stats[1].allocations, 0u) << "rank " << comm.rank();
    });
  }
}

}  // namespace
}  // namespace gradcomp
