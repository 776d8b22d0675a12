// The pipelined runtime (RuntimeOptions::pipeline_lanes) against the unpipelined one (lanes 0: every buffer on the
// negotiation thread): bit-identical results for every codec with several buffers per cycle on several lanes; what
// fusion copies (only tensors that share a buffer; a tensor alone runs in the caller's memory) and what a
// steady-state cycle costs (one control round of a fixed small size), both counted; a lane whose peer stops
// answering stops the runtime with an error instead of hanging.
#include <gtest/gtest.h>

#include <barrier>
#include <bit>
#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;
using testing::run_ranks_collect;

const char* const kEveryCodec[] = {"none", "fp16", "bf16", "qsgd:bits=4", "terngrad", "onebit", "topk:ratio=0.05",
                                   "randomk:ratio=0.1", "blocktopk:ratio=0.1,block=16",
                                   "dgc:ratio=0.05,warmup_steps=1", "powersgd:rank=2"};
// Small tensors that fuse (several buffers under the 16 KB threshold) and two above the 24 KB tensor limit that
// travel alone.
const std::vector<std::size_t> kSizes = {1000, 3, 2048, 700, 8000, 257, 12000, 1500, 64, 3000, 9000, 40};

RuntimeOptions options_with(int lanes) {
  RuntimeOptions options;
  options.pipeline_lanes = lanes;
  options.fusion_threshold_bytes = 16 << 10;
  options.fusion_tensor_limit_bytes = 24 << 10;
  options.timeline_path = "";
  return options;
}

// Three steps of every tensor of kSizes (a matrix of 4 rows where it divides, for PowerSGD); returns every result,
// bit for bit, and the lanes the buffers ran on.
std::vector<std::vector<std::uint32_t>> run(Communicator& comm, const std::string& spec, int lanes,
                                            std::set<int>* lanes_used = nullptr) {
  Runtime rt(comm, options_with(lanes));
  std::vector<std::vector<std::uint32_t>> out;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> data(kSizes.size());
    std::mt19937 rng(11 + 1000 * comm.rank() + step);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      data[t].resize(kSizes[t]);
      for (float& v : data[t]) v = normal(rng);
      TensorView view = TensorView::of(std::span<float>(data[t]));
      if (kSizes[t] % 4 == 0) view = view.with_rows(4);
      rt.allreduce_async(fmt::format("layer{}", t), view, spec);
    }
    rt.synchronize();
    for (const auto& tensor : data) {
      std::vector<std::uint32_t> bits(tensor.size());
      for (std::size_t i = 0; i < tensor.size(); ++i) bits[i] = std::bit_cast<std::uint32_t>(tensor[i]);
      out.push_back(std::move(bits));
    }
  }
  if (lanes_used != nullptr) {
    for (const BufferRecord& record : rt.stats().buffers) lanes_used->insert(record.lane);
  }
  return out;
}

class Pipelined : public ::testing::TestWithParam<int> {};

TEST_P(Pipelined, EveryCodecGivesTheUnpipelinedBits) {
  const int ranks = GetParam();
  for (const char* spec : kEveryCodec) {
    SCOPED_TRACE(spec);
    run_ranks(ranks, [&](Communicator& comm) {
      std::set<int> inline_lanes, two_lanes;
      const auto reference = run(comm, spec, 0, &inline_lanes);
      EXPECT_EQ(inline_lanes, std::set<int>{-1}) << "lanes 0: every buffer on the negotiation thread";
      const auto pipelined = run(comm, spec, 2, &two_lanes);
      ASSERT_EQ(pipelined.size(), reference.size());
      for (std::size_t t = 0; t < reference.size(); ++t) {
        ASSERT_EQ(pipelined[t], reference[t]) << "tensor " << t % kSizes.size() << " at step " << t / kSizes.size()
                                              << " on rank " << comm.rank();
      }
      // Rounds codecs (powersgd) keep every buffer on lane 0; the others spread over both lanes.
      const std::set<int> expected = std::string(spec).starts_with("powersgd") ? std::set<int>{0} : std::set<int>{0, 1};
      EXPECT_EQ(two_lanes, expected);
      ASSERT_EQ(run(comm, spec, 3), reference) << "three lanes";
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Pipelined, ::testing::Values(2, 4));

// Fusion copies only what shares a buffer: with `none` (a codec that encodes parts) not even that, the small tensors
// are encoded from and decoded into the caller's memory (zero-copy, counted in gathered_bytes); with zero-copy
// fusion off they are copied once in and once out. The large one runs alone in the caller's memory. A step whose
// tensor set repeats is negotiated from the response cache: every cycle then costs exactly one control round of a
// fixed small size (header + one bit per cached name), and the tensors are ready in one of them.
TEST(Pipelined, CountsCopiesAndControlRounds) {
  for (int lanes : {0, 2}) {
    for (bool gather : {true, false}) {
      SCOPED_TRACE(fmt::format("lanes {}, gather {}", lanes, gather));
      // The two rank threads start each step together, and a cycle lasts long enough that the step's four tensors,
      // enqueued back to back, meet in one cycle even on a loaded machine (with 5 ms a preempted rank thread split
      // the step over two cycles under CI's parallel ctest).
      std::barrier step_start(2);
      run_ranks(2, [&](Communicator& comm) {
        RuntimeOptions options = options_with(lanes);
        options.fusion_gather = gather;
        options.fusion_threshold_bytes = 64 << 10;
        options.cycle_time_ms = 50;
        Runtime rt(comm, options);
        std::vector<std::vector<float>> data = {std::vector<float>(100), std::vector<float>(300),
                                                std::vector<float>(50), std::vector<float>(10000)};
        const std::size_t fused_bytes = (100 + 300 + 50) * sizeof(float);
        const std::size_t alone_bytes = 10000 * sizeof(float);
        for (int step = 0; step < 3; ++step) {
          step_start.arrive_and_wait();
          for (std::size_t t = 0; t < data.size(); ++t) {
            std::fill(data[t].begin(), data[t].end(), static_cast<float>(comm.rank() + t + step));
            rt.allreduce_async(fmt::format("t{}", t), TensorView::of(std::span<float>(data[t])), "none");
          }
          rt.synchronize();
          const RuntimeStats stats = rt.take_stats();
          EXPECT_EQ(stats.copy_bytes, gather ? 0 : 2 * fused_bytes) << "step " << step;
          EXPECT_EQ(stats.gathered_bytes, gather ? fused_bytes : 0) << "step " << step;
          EXPECT_EQ(stats.alone_bytes, alone_bytes) << "step " << step;
          EXPECT_EQ(stats.buffers.size(), 2u) << "step " << step;  // no early return: the peer waits at step_start
          for (const BufferRecord& record : stats.buffers) {
            EXPECT_EQ(record.copy_bytes, record.tensors == 1 || gather ? 0 : 2 * fused_bytes);
            EXPECT_EQ(record.gathered, record.tensors > 1 && gather);
            EXPECT_EQ(record.lane == -1, lanes == 0);
          }
          for (std::size_t t = 0; t < data.size(); ++t) {
            EXPECT_EQ(data[t][0], (static_cast<float>(t + step) + static_cast<float>(t + step + 1)) / 2);
          }
          if (step == 0) {
            EXPECT_GT(stats.negotiation_collectives, stats.cycles) << "new names are announced";
            continue;
          }
          // Cached: one round per cycle, each 32 header bytes + one byte of bits for four cached names.
          EXPECT_EQ(stats.busy_cycles, 1u) << "step " << step;
          EXPECT_EQ(stats.negotiation_collectives, stats.cycles) << "step " << step;
          EXPECT_EQ(stats.negotiation_bytes, stats.cycles * 33) << "step " << step;
        }
      });
    }
  }
}

// A lane whose peer stops answering (rank 1's completion callback blocks its lane far past the timeout, against the
// contract) ends in an error on both ranks, in bounded time; the runtime then refuses new work.
TEST(Pipelined, AStuckPeerLaneFailsTheRuntimeInsteadOfHanging) {
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks_collect(
      2,
      [&](Communicator& comm) {
        RuntimeOptions options = options_with(2);
        options.timeout = std::chrono::milliseconds(400);
        Runtime rt(comm, options);
        std::vector<std::vector<float>> data(4, std::vector<float>(10000, 1.0f));
        std::vector<Handle> handles;
        for (std::size_t t = 0; t < data.size(); ++t) {
          const TensorView view = TensorView::of(std::span<float>(data[t]));
          if (t == 0 && comm.rank() == 1) {
            rt.allreduce_async("big0", view, "none",
                               [](const Status&) { std::this_thread::sleep_for(std::chrono::milliseconds(2500)); });
          } else {
            handles.push_back(rt.allreduce_async(fmt::format("big{}", t), view, "none"));
          }
        }
        bool failed = false;
        for (const Handle& handle : handles) {
          try {
            rt.wait(handle);
          } catch (const Timeout&) {
            failed = true;
          } catch (const CommError&) {
            failed = true;
          }
        }
        EXPECT_TRUE(failed) << "rank " << comm.rank() << ": a buffer behind the stuck lane must fail";
        EXPECT_THROW(rt.allreduce_async("after", TensorView::of(std::span<float>(data[1])), "none"), Error)
            << "rank " << comm.rank();
      },
      std::chrono::milliseconds(400));
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
}  // namespace gradcomp
