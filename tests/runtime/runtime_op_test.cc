// The fusion runtime's per-request reduce op (issue 16), on comm/local (ranks as threads): a sum is exactly the sum
// of the ranks' values (computed as a sum, not as an average scaled back), fused requests of different ops never
// share a buffer, a name's op is part of what the ranks must agree on, and RuntimeOptions::op is the default.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

RuntimeOptions fusing_options() {
  RuntimeOptions options;
  options.fusion_threshold_bytes = std::size_t{64} << 20;  // every tensor below fits: only the op keeps them apart
  options.fusion_tensor_limit_bytes = 0;
  options.timeline_path = "";
  options.cycle_time_ms = 20;  // a rank's submissions of a step land in one cycle
  return options;
}

// Values with full mantissas (not small integers), so a sum rebuilt as average x size loses bits.
std::vector<float> values_of(int rank, int tensor, int step, std::size_t numel) {
  std::mt19937 rng(static_cast<unsigned>(1000003 * rank + 7919 * tensor + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(numel);
  for (auto& x : v) x = normal(rng);
  return v;
}

// What the none codec gives: the local communicator adds the ranks' bodies in rank order; an average prescales each
// rank's values by 1/n before that sum.
std::vector<float> expected(int ranks, int tensor, int step, std::size_t numel, ReduceOp op) {
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(ranks) : 1.0f;
  std::vector<float> acc = values_of(0, tensor, step, numel);
  if (scale != 1.0f) {
    for (auto& x : acc) x *= scale;
  }
  for (int r = 1; r < ranks; ++r) {
    const std::vector<float> v = values_of(r, tensor, step, numel);
    for (std::size_t i = 0; i < numel; ++i) acc[i] += scale == 1.0f ? v[i] : v[i] * scale;
  }
  return acc;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Requests alternate between sum, average and the default (average) within each step; step 1 reuses the response
// cache, step 2 flips every op (a cached name submitted with another op is negotiated again).
void sum_and_average_side_by_side(int ranks) {
  constexpr int kTensors = 12;
  constexpr int kSteps = 3;
  run_ranks(ranks, [&](Communicator& comm) {
    Runtime rt(comm, fusing_options());
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> data(kTensors);
      std::vector<std::optional<ReduceOp>> ops(kTensors);
      std::size_t sums = 0;
      for (int t = 0; t < kTensors; ++t) {
        const std::size_t numel = 500 + 37 * static_cast<std::size_t>(t);
        data[t] = values_of(comm.rank(), t, step, numel);
        const bool sum = (t % 2 == 0) != (step == 2);
        ops[t] = sum ? std::optional(ReduceOp::kSum) : t % 4 == 1 ? std::optional(ReduceOp::kAverage) : std::nullopt;
        sums += sum ? 1 : 0;
      }
      for (int t = 0; t < kTensors; ++t) {
        rt.allreduce_async(fmt::format("layer{}.weight", t), TensorView::of(std::span<float>(data[t])), "none",
                           ops[t]);
      }
      rt.synchronize();
      for (int t = 0; t < kTensors; ++t) {
        const ReduceOp op = ops[t].value_or(ReduceOp::kAverage);
        EXPECT_TRUE(same_bits(data[t], expected(ranks, t, step, data[t].size(), op)))
            << "rank " << comm.rank() << " of " << ranks << ", step " << step << ", tensor " << t << ", op "
            << reduce_op_name(op);
      }
      // Every buffer carries one op: the tensors of the sum buffers are exactly the sum requests.
      const RuntimeStats stats = rt.take_stats();
      std::size_t sum_tensors = 0, average_tensors = 0, buffers = 0;
      for (const BufferRecord& record : stats.buffers) {
        (record.op == ReduceOp::kSum ? sum_tensors : average_tensors) += record.tensors;
        ++buffers;
      }
      EXPECT_EQ(sum_tensors, sums) << "step " << step;
      EXPECT_EQ(average_tensors, kTensors - sums) << "step " << step;
      EXPECT_GE(buffers, 2u);
    }
  });
}

TEST(RuntimeOp, SumIsTheExactSumAndOpsNeverShareABuffer2Ranks) { sum_and_average_side_by_side(2); }
TEST(RuntimeOp, SumIsTheExactSumAndOpsNeverShareABuffer3Ranks) { sum_and_average_side_by_side(3); }
TEST(RuntimeOp, SumIsTheExactSumAndOpsNeverShareABuffer4Ranks) { sum_and_average_side_by_side(4); }

// Why the op is per request: on 3 ranks the average scaled back by 3 (what the Python runtime backend used to do for
// Sum) is not the sum.
TEST(RuntimeOp, AverageTimesSizeIsNotTheSum) {
  constexpr std::size_t kNumel = 4096;
  const std::vector<float> sum = expected(3, 0, 0, kNumel, ReduceOp::kSum);
  const std::vector<float> average = expected(3, 0, 0, kNumel, ReduceOp::kAverage);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < kNumel; ++i) differ += average[i] * 3.0f != sum[i] ? 1 : 0;
  EXPECT_GT(differ, 0u);
}

TEST(RuntimeOp, RanksThatDisagreeOnTheOpFailOnEveryRank) {
  run_ranks(2, [](Communicator& comm) {
    RuntimeOptions options = fusing_options();
    options.cycle_time_ms = 1;
    Runtime rt(comm, options);
    std::vector<float> x(64, 1.0f);
    const ReduceOp op = comm.rank() == 0 ? ReduceOp::kSum : ReduceOp::kAverage;
    Handle h = rt.allreduce_async("w", TensorView::of(std::span<float>(x)), "none", op);
    try {
      rt.wait(h);
      ADD_FAILURE() << "rank " << comm.rank() << ": no error";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("op sum"), std::string::npos) << message;
      EXPECT_NE(message.find("op average"), std::string::npos) << message;
    }
    // The same name with one op everywhere then runs.
    std::vector<float> y(64, static_cast<float>(comm.rank() + 1));
    rt.wait(rt.allreduce_async("w", TensorView::of(std::span<float>(y)), "none", ReduceOp::kSum));
    EXPECT_EQ(y[0], 3.0f);
  });
}

TEST(RuntimeOp, DefaultIsTheOptionsOpAndOnlySumOrAverageAreAccepted) {
  run_ranks(2, [](Communicator& comm) {
    RuntimeOptions options = fusing_options();
    options.cycle_time_ms = 1;
    options.op = ReduceOp::kSum;
    Runtime rt(comm, options);
    std::vector<float> x(10, static_cast<float>(comm.rank() + 1));
    rt.wait(rt.allreduce_async("x", TensorView::of(std::span<float>(x))));
    EXPECT_EQ(x[0], 3.0f);
    rt.wait(rt.allreduce_async("x", TensorView::of(std::span<float>(x)), "", ReduceOp::kAverage));
    EXPECT_EQ(x[0], 3.0f);
    EXPECT_THROW(rt.allreduce_async("m", TensorView::of(std::span<float>(x)), "", ReduceOp::kMax), InvalidArgument);
  });
}

}  // namespace
}  // namespace gradcomp
