// The fusion runtime under mpirun: ordering across processes, fused == unfused for a summable codec and both the
// average of every rank's input, a size mismatch raising on every rank, zero-copy fusion's bits and a partitioned
// tensor's bits.
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

// Zero-copy fusion on MPI (each member encoded straight into the communicator's own send buffer, the sum decoded
// straight into the members): bit-identical to the copying fused path and to each tensor alone, unpipelined and on
// two lanes, with no byte copied.
TEST(RuntimeMpi, ZeroCopyFusionIsBitIdenticalToCopiesAndAlone) {
  Communicator& comm = mpi_world();
  const std::vector<std::size_t> sizes = {7, 1000, 33333, 5, 2000};
  for (const char* spec : {"none", "fp16", "bf16"}) {
    for (int lanes : {0, 2}) {
      SCOPED_TRACE(fmt::format("{}, lanes {}", spec, lanes));
      std::vector<std::vector<std::uint32_t>> bits[3];  // gathered, copied, alone
      for (int mode = 0; mode < 3; ++mode) {
        RuntimeOptions options = options_with(mode == 2 ? 0 : std::size_t{1} << 20);
        options.pipeline_lanes = lanes;
        options.fusion_gather = mode == 0;
        Runtime rt(comm, options);
        for (int step = 0; step < 3; ++step) {
          std::mt19937 rng(17 + 100 * comm.rank() + step);
          std::normal_distribution<float> normal;
          std::vector<std::vector<float>> data(sizes.size());
          for (std::size_t t = 0; t < sizes.size(); ++t) {
            data[t].resize(sizes[t]);
            for (float& v : data[t]) v = normal(rng);
            rt.allreduce_async(fmt::format("t{}", t), TensorView::of(std::span<float>(data[t])), spec);
          }
          rt.synchronize();
          const RuntimeStats stats = rt.take_stats();
          if (mode == 0) {
            EXPECT_EQ(stats.copy_bytes, 0u);
            EXPECT_EQ(stats.gathered_bytes + stats.alone_bytes, stats.input_bytes);
          }
          for (const auto& tensor : data) {
            std::vector<std::uint32_t> b(tensor.size());
            for (std::size_t i = 0; i < tensor.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(tensor[i]);
            bits[mode].push_back(std::move(b));
          }
        }
      }
      for (std::size_t t = 0; t < bits[0].size(); ++t) {
        ASSERT_EQ(bits[0][t], bits[1][t]) << "tensor " << t % sizes.size() << " step " << t / sizes.size();
        ASSERT_EQ(bits[0][t], bits[2][t]) << "tensor " << t % sizes.size() << " step " << t / sizes.size();
      }
    }
  }
}

// Partitioning on MPI (RuntimeOptions::partition_bytes): a 12 MB tensor in six parts of 2 MB, each its own ring on
// one of two lanes, gets the bits it gets whole. At 2 ranks any data (a + b = b + a); at 4 ranks small integers, whose
// sums are exact in every order (a dense sum's rounding may depend on an element's position there, as with fusion).
TEST(RuntimeMpi, APartitionedTensorGetsItsWholeBits) {
  Communicator& comm = mpi_world();
  constexpr std::size_t kNumel = 3000000;
  for (const char* spec : {"none", "fp16"}) {
    SCOPED_TRACE(spec);
    std::vector<std::uint32_t> bits[2];  // whole, parts
    std::size_t buffers[2] = {0, 0};
    for (int parted = 0; parted < 2; ++parted) {
      RuntimeOptions options = options_with(std::size_t{64} << 20);
      options.pipeline_lanes = 2;
      options.partition_bytes = parted ? std::size_t{2} << 20 : 0;
      Runtime rt(comm, options);
      for (int step = 0; step < 2; ++step) {
        std::mt19937 rng(3 + 100 * comm.rank() + step);
        std::normal_distribution<float> normal;
        std::vector<float> data(kNumel);
        for (float& v : data) v = comm.size() == 2 ? normal(rng) : static_cast<float>(rng() % 16);
        rt.wait(rt.allreduce_async("fc.weight", TensorView::of(std::span<float>(data)), spec));
        for (float v : data) bits[parted].push_back(std::bit_cast<std::uint32_t>(v));
        buffers[parted] += rt.take_stats().messages;
      }
    }
    EXPECT_EQ(buffers[0], 2u);
    EXPECT_EQ(buffers[1], 12u) << "two steps of six parts";
    ASSERT_EQ(bits[0].size(), bits[1].size());
    for (std::size_t i = 0; i < bits[0].size(); ++i) {
      ASSERT_EQ(bits[1][i], bits[0][i]) << "element " << i % kNumel << " of step " << i / kNumel << " on rank "
                                        << comm.rank();
    }
  }
}

}  // namespace
}  // namespace gradcomp
