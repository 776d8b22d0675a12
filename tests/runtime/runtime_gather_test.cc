// Zero-copy fusion (RuntimeOptions::fusion_gather): fused buffers of none/fp16/bf16 are encoded from the members'
// memory and decoded into it, with no fusion buffer. Every result is bit-identical to the copying fused path and to
// each tensor alone, at 2 and 4 ranks, unpipelined and on two lanes, for f32 and bf16 tensors; the buffers are
// counted (gathered, copy_bytes 0); codecs that cannot encode parts keep the copy.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

// Several fused buffers under the 16 KB threshold, two tensors above the 24 KB limit that travel alone.
const std::vector<std::size_t> kSizes = {1000, 3, 2048, 700, 8000, 257, 12000, 1500, 64, 3000, 9000, 40};
constexpr std::size_t kBf16Tensors = 3;  // the first three also have a bf16 twin (their own fusion buffers)

enum class Mode { kGathered, kCopied, kAlone };

struct Result {
  std::vector<std::vector<std::uint32_t>> bits;  // every tensor at every step
  RuntimeStats stats;                            // the last step's
};

Result run(Communicator& comm, const std::string& spec, int lanes, Mode mode) {
  RuntimeOptions options;
  options.pipeline_lanes = lanes;
  options.fusion_threshold_bytes = mode == Mode::kAlone ? 0 : 16 << 10;
  options.fusion_tensor_limit_bytes = 24 << 10;
  options.fusion_gather = mode == Mode::kGathered;
  options.timeline_path = "";
  Runtime rt(comm, options);
  Result result;
  for (int step = 0; step < 3; ++step) {
    std::mt19937 rng(5 + 1000 * comm.rank() + step);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::vector<float>> data(kSizes.size());
    std::vector<std::vector<std::uint16_t>> halves(kBf16Tensors);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      data[t].resize(kSizes[t]);
      for (float& v : data[t]) v = normal(rng);
      rt.allreduce_async(fmt::format("layer{}", t), TensorView::of(std::span<float>(data[t])), spec);
    }
    for (std::size_t t = 0; t < kBf16Tensors; ++t) {
      halves[t].resize(kSizes[t]);
      for (auto& h : halves[t]) h = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(normal(rng)) >> 16);
      rt.allreduce_async(fmt::format("half{}", t), TensorView(halves[t].data(), kSizes[t], DType::kBF16), spec);
    }
    rt.synchronize();
    result.stats = rt.take_stats();
    for (const auto& tensor : data) {
      std::vector<std::uint32_t> bits(tensor.size());
      std::memcpy(bits.data(), tensor.data(), tensor.size() * sizeof(float));
      result.bits.push_back(std::move(bits));
    }
    for (const auto& tensor : halves) result.bits.emplace_back(tensor.begin(), tensor.end());
  }
  return result;
}

class ZeroCopyFusion : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCopyFusion, BitIdenticalToTheCopyingPathAndToEachTensorAlone) {
  for (const char* spec : {"none", "fp16", "bf16", "fp16:ef=off"}) {
    for (int lanes : {0, 2}) {
      SCOPED_TRACE(fmt::format("{}, lanes {}", spec, lanes));
      run_ranks(GetParam(), [&](Communicator& comm) {
        const Result gathered = run(comm, spec, lanes, Mode::kGathered);
        const Result copied = run(comm, spec, lanes, Mode::kCopied);
        const Result alone = run(comm, spec, lanes, Mode::kAlone);
        ASSERT_EQ(gathered.bits.size(), copied.bits.size());
        for (std::size_t t = 0; t < gathered.bits.size(); ++t) {
          ASSERT_EQ(gathered.bits[t], copied.bits[t]) << "tensor " << t << " on rank " << comm.rank();
          ASSERT_EQ(gathered.bits[t], alone.bits[t]) << "tensor " << t << " on rank " << comm.rank();
        }
        // Counted: no byte copied when gathered, every fused byte twice when copied (which tensors share a buffer
        // follows the cycles' timing, so each run is checked against its own buffers).
        EXPECT_EQ(gathered.stats.copy_bytes, 0u);
        EXPECT_GT(gathered.stats.gathered_bytes, 0u);
        EXPECT_EQ(gathered.stats.gathered_bytes + gathered.stats.alone_bytes, gathered.stats.input_bytes);
        EXPECT_EQ(copied.stats.gathered_bytes, 0u);
        EXPECT_EQ(copied.stats.copy_bytes, 2 * (copied.stats.input_bytes - copied.stats.alone_bytes));
        for (const BufferRecord& record : gathered.stats.buffers) {
          EXPECT_EQ(record.gathered, record.tensors > 1);
          EXPECT_EQ(record.copy_bytes, 0u);
          EXPECT_EQ(record.algorithm, "dense");
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroCopyFusion, ::testing::Values(2, 4));

// A codec whose payload is not one summable body (sparse, quantized, low-rank) still fuses through a copy.
TEST(ZeroCopyFusion, OtherCodecsKeepTheCopy) {
  for (const char* spec : {"topk:ratio=0.1", "qsgd:bits=4"}) {
    SCOPED_TRACE(spec);
    run_ranks(2, [&](Communicator& comm) {
      const Result result = run(comm, spec, 2, Mode::kGathered);
      EXPECT_EQ(result.stats.gathered_bytes, 0u);
      EXPECT_EQ(result.stats.copy_bytes, 2 * (result.stats.input_bytes - result.stats.alone_bytes));
      for (const BufferRecord& record : result.stats.buffers) EXPECT_FALSE(record.gathered);
    });
  }
}

}  // namespace
}  // namespace gradcomp
