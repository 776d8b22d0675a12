// The fusion runtime under mpirun: ordering across processes, fused == unfused for a summable codec and both the
// average of every rank's input, and a size mismatch raising on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>

#include "gradcomp/error.h"
#include "gradcomp/runtime.h"
#include "tests/comm/mpi_world.h"
#include "tests/comm/sum_bound.h"

namespace gradcomp {
namespace {

using testing::mpi_world;

RuntimeOptions options_with(std::size_t threshold) {
  RuntimeOptions options;
  options.fusion_threshold_bytes = threshold;
  options.timeline_path = "";
  return options;
}

TEST(RuntimeMpi, ShuffledTensorsCompleteWithExactAverages) {
  Communicator& comm = mpi_world();
  const int n = comm.size();
  constexpr int kTensors = 200;
  constexpr std::size_t kNumel = 2560;
  Runtime rt(comm, options_with(std::size_t{64} << 20));
  std::vector<std::vector<float>> data(kTensors, std::vector<float>(kNumel));
  for (int t = 0; t < kTensors; ++t) {
    for (std::size_t i = 0; i < kNumel; ++i) data[t][i] = static_cast<float>(comm.rank() * 4 + (t + i) % 5);
  }
  std::vector<int> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(99 + comm.rank()));
  std::vector<Handle> handles(kTensors);
  for (int t : order) handles[t] = rt.allreduce_async(fmt::format("w{}", t), TensorView::of(std::span<float>(data[t])));
  for (Handle h : handles) rt.wait(h);
  for (int t = 0; t < kTensors; ++t) {
    for (std::size_t i = 0; i < kNumel; ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += static_cast<float>(r * 4 + (t + i) % 5);
      ASSERT_FLOAT_EQ(data[t][i], expected / n) << "tensor " << t << " element " << i;
    }
  }
  EXPECT_LT(rt.stats().messages, 40u);
}

TEST(RuntimeMpi, FusedEqualsUnfusedAndMismatchRaises) {
  Communicator& comm = mpi_world();
  const std::vector<std::size_t> sizes = {7, 1000, 33333, 5};
  std::vector<std::vector<float>> results[2];
  for (int fused = 0; fused < 2; ++fused) {
    Runtime rt(comm, options_with(fused ? std::size_t{1} << 20 : 0));
    std::mt19937 rng(3 + comm.rank());
    std::normal_distribution<float> normal;
    results[fused].resize(sizes.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      results[fused][t].resize(sizes[t]);
      for (float& v : results[fused][t]) v = normal(rng);
      rt.allreduce_async(fmt::format("t{}", t), TensorView::of(std::span<float>(results[fused][t])), "none");
    }
    rt.synchronize();
    if (fused) {
      std::vector<float> x(comm.rank() == 0 ? 10 : 20, 1.0f);
      Handle h = rt.allreduce_async("t0", TensorView::of(std::span<float>(x)));
      EXPECT_THROW(rt.wait(h), InvalidArgument);
    }
  }
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(results[0][t][i]), std::bit_cast<std::uint32_t>(results[1][t][i]));
    }
  }
  // Both are the average of every rank's input (each rank's draws rebuilt here), within the f32 sum's bound.
  const int n = comm.size();
  std::vector<std::vector<float>> inputs(n);
  for (int r = 0; r < n; ++r) {
    std::mt19937 rng(3 + r);
    std::normal_distribution<float> normal;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      for (std::size_t i = 0; i < sizes[t]; ++i) inputs[r].push_back(normal(rng));
    }
  }
  std::size_t flat = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i, ++flat) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        exact += inputs[r][flat];
        magnitude += std::fabs(inputs[r][flat]);
      }
      const double bound = testing::sum_error_bound(DType::kF32, n, magnitude / n, /*rounded_inputs=*/true);
      ASSERT_LE(std::fabs(results[1][t][i] - exact / n), bound) << "tensor " << t << " element " << i;
    }
  }
}

}  // namespace
}  // namespace gradcomp
