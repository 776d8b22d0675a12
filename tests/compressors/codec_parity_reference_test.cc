// The CPU half of every test in tests/gpu/codec_parity_gpu_test.cc, over the same spec list and the same data
// (tests/gpu/parity_data.h): each GPU test compares the GPU with a CPU reference run and checks an invariant, and
// both of those run here, in every build, so a bug in the test's data or invariant shows on any machine instead of
// on the first GPU run. What only a GPU can check is the bit-for-bit comparison itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compressors/codecs/dgc.h"
#include "compressors/framework/error_feedback.h"
#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/half_ops.cuh"
#include "tests/gpu/parity_data.h"

namespace gradcomp {
namespace {

// The data of one (size, step) of PayloadsAndStateAreBitIdentical, generated once for all specs (the largest size
// takes a while to draw).
const std::vector<float>& step_values(std::size_t n, std::uint64_t step) {
  static std::map<std::pair<std::size_t, std::uint64_t>, std::vector<float>> cache;
  auto& values = cache[{n, step}];
  if (values.empty()) values = parity::random_values(n + 1, parity::step_seed(n, step));
  return values;
}

CompressContext parity_context(std::uint64_t step) {
  CompressContext ctx;
  ctx.name = "layer.weight";
  ctx.step = step;
  ctx.world_size = 4;
  ctx.prescale = 0.25f;
  return ctx;
}

class Reference : public ::testing::TestWithParam<std::string> {};

// PayloadsAndStateAreBitIdentical: the reference compresses every size and view without raising, and is itself
// deterministic: one thread and several threads give the same payloads and state (the GPU reproduces the CPU's
// order of operations, which would be meaningless if the CPU's result depended on its thread count).
TEST_P(Reference, PayloadsAreDeterministicOverStepsAndThreads) {
  for (const std::size_t n : parity::sizes()) {
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      auto one = make_compressor(GetParam());
      auto many = make_compressor(GetParam());
      one->set_threads(1);
      many->set_threads(4);
      for (std::uint64_t step = 0; step < 3; ++step) {
        const auto& values = step_values(n, step);
        const auto view = TensorView::of(std::span<const float>(values.data() + offset, n));
        const auto ctx = parity_context(step);
        std::vector<std::byte> a, b;
        ASSERT_NO_THROW(a = compress_to_vector(*one, view, ctx)) << GetParam() << " n=" << n << " step " << step;
        b = compress_to_vector(*many, view, ctx);
        ASSERT_LE(a.size(), one->max_payload_bytes(n));
        EXPECT_EQ(one->last_stats().nonfinite, 0u);
        ASSERT_TRUE(a == b) << GetParam() << ": payload depends on the thread count, n=" << n << " offset=" << offset
                            << " step " << step;
      }
      EXPECT_EQ(one->save_state(), many->save_state()) << GetParam() << " n=" << n;
    }
  }
}

// CrossDeviceDecode: a payload decodes, overwrite then accumulate gives twice the values (x + x is exact).
TEST_P(Reference, DecodeOverwriteThenAccumulate) {
  const std::size_t n = 65537;
  auto compressor = make_compressor(GetParam());
  const auto values = parity::random_values(n, 7);
  CompressContext ctx;
  ctx.name = "t";
  ctx.prescale = 0.5f;
  const auto payload = compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx);
  std::vector<float> once(n, 1.0f), twice;
  compressor->decompress(payload, TensorView::of(std::span<float>(once)), DecodeMode::kOverwrite);
  twice = once;
  compressor->decompress(payload, TensorView::of(std::span<float>(twice)), DecodeMode::kAccumulate);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(once[i])) << GetParam() << " index " << i;
    ASSERT_EQ(twice[i], 2.0f * once[i]) << GetParam() << " index " << i;
  }
}

// HalfPrecisionTensors: the half data is finite in its format (so nonfinite=raise does not reject it), compresses
// without non-finite values, and decodes into a tensor of that format.
TEST_P(Reference, HalfPrecisionTensors) {
  const std::size_t n = 30001;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    const auto values = parity::random_values(n, 11, 0.1f, parity::kHalfOutlier);
    std::vector<std::uint16_t> bits(n);
    for (std::size_t i = 0; i < n; ++i) {
      bits[i] = dtype == DType::kF16 ? kernels::float_to_half_bits(values[i]) : kernels::float_to_bf16_bits(values[i]);
      const float back = dtype == DType::kF16 ? kernels::half_bits_to_float(bits[i])
                                              : kernels::bf16_bits_to_float(bits[i]);
      ASSERT_TRUE(std::isfinite(back)) << dtype_name(dtype) << " test data is not finite at " << i;
    }
    auto compressor = make_compressor(GetParam());
    CompressContext ctx;
    ctx.name = "h";
    std::vector<std::byte> payload(compressor->max_payload_bytes(n));
    ASSERT_NO_THROW(payload.resize(compressor->compress(TensorView(bits.data(), n, dtype), payload, ctx)))
        << GetParam() << " " << dtype_name(dtype);
    EXPECT_EQ(compressor->last_stats().nonfinite, 0u);
    std::vector<std::uint16_t> out(n, 0);
    compressor->decompress(payload, TensorView(out.data(), n, dtype), DecodeMode::kOverwrite);
  }
}

// ErrorFeedbackInvariantOnGpu, with the CPU codec and the same tolerance rule (parity::ef_tolerance).
TEST_P(Reference, ErrorFeedbackInvariant) {
  auto compressor = make_compressor(GetParam());
  if (!compressor->traits().lossy || compressor->spec().find("ef=off") != std::string::npos) {
    GTEST_SKIP() << "no error feedback";
  }
  if (GetParam().rfind("dgc", 0) == 0) GTEST_SKIP() << "dgc: momentum correction, not plain error feedback";
  const std::size_t n = 50000;
  auto* ef = dynamic_cast<ErrorFeedbackCompressor*>(compressor.get());
  ASSERT_NE(ef, nullptr);
  const float scale = parity::wire_scale(GetParam(), 1.0f);
  std::vector<float> residual_before(n, 0.0f);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto values = parity::random_values(n, static_cast<unsigned>(100 + step));
    CompressContext ctx;
    ctx.name = "ef";
    ctx.step = step;
    const auto payload = compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx);
    std::vector<float> decoded(n, 0.0f);
    compressor->decompress(payload, TensorView::of(std::span<float>(decoded)), DecodeMode::kOverwrite);
    const auto& residual = ef->state_of("ef")->buffers[0];
    ASSERT_EQ(residual.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const float sent = decoded[i] / scale;
      const float v = residual_before[i] + values[i];
      ASSERT_NEAR(residual[i] + sent, v, parity::ef_tolerance(residual[i], sent, v))
          << GetParam() << " index " << i << " step " << step;
    }
    residual_before = residual;
  }
}

// The tolerance is not so loose that a residual missing what was sent would pass: dropping one element's update
// must break the invariant wherever something non-zero was sent.
TEST(ReferenceTolerance, CatchesAMissedResidualUpdate) {
  for (const float sent : {1e-3f, 0.5f, 6666.0f, 1e5f}) {
    for (const float v : {0.0f, 1e-3f, 1.0f, -3.0f}) {
      const float stale = v;  // the residual kept v instead of v - sent
      EXPECT_GT(std::fabs(stale + sent - v), parity::ef_tolerance(stale, sent, v)) << sent << " " << v;
    }
  }
  EXPECT_EQ(parity::wire_scale("fp16:prescale=0.25", 1.0f), 0.25f);
  EXPECT_EQ(parity::wire_scale("topk", 0.5f), 0.5f);
}

// NonFinitePolicies: raise throws InvalidArgument and leaves the state untouched; skip and pass count the two
// non-finite values, skip marks the step skipped (the NaN bytes of pass: canonical_nan_test).
TEST_P(Reference, NonFinitePolicies) {
  const std::size_t n = 4099;
  for (const char* policy : {"raise", "skip", "pass"}) {
    const std::string spec = parity::with_param(GetParam(), std::string("nonfinite=") + policy);
    auto compressor = make_compressor(spec);
    CompressContext ctx;
    ctx.name = "nf";
    auto values = parity::random_values(n, 5);
    ASSERT_NO_THROW(compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx)) << spec;
    const std::size_t nonfinite = parity::put_nonfinite(values);
    ctx.step = 1;
    if (std::string(policy) == "raise") {
      const auto before = compressor->save_state();
      EXPECT_THROW(compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx),
                   InvalidArgument)
          << spec;
      EXPECT_EQ(compressor->save_state(), before) << spec << ": a rejected step changed the state";
      continue;
    }
    compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx);
    EXPECT_EQ(compressor->last_stats().nonfinite, nonfinite) << spec;
    EXPECT_EQ(compressor->last_stats().skipped, std::string(policy) == "skip") << spec;
  }
}

// OverflowFallbacks: finite values whose f32 sums overflow compress without a non-finite count, and the quantizers'
// bucket scales stay finite (their double-precision fallbacks ran).
TEST_P(Reference, OverflowFallbacks) {
  const std::size_t n = 100003;
  auto compressor = make_compressor(GetParam());
  const auto values = parity::overflow_values(n, 21);
  CompressContext ctx;
  ctx.name = "o";
  for (std::uint64_t step = 0; step < 2; ++step) {
    ctx.step = step;
    std::vector<std::byte> payload;
    ASSERT_NO_THROW(payload = compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx))
        << GetParam();
    EXPECT_EQ(compressor->last_stats().nonfinite, 0u) << GetParam();
    const auto header = payload::peek_header(payload);
    const bool quantizer = header.codec == payload::CodecId::kQsgd || header.codec == payload::CodecId::kTernGrad ||
                           header.codec == payload::CodecId::kOneBit;
    if (!quantizer) continue;
    const auto view = payload::parse(payload, header.codec, static_cast<long long>(n));
    const std::size_t scales = view.sections[0].size() / sizeof(float);
    for (std::size_t b = 0; b < scales; ++b) {
      float scale;
      std::memcpy(&scale, view.sections[0].data() + b * sizeof(float), sizeof(scale));
      ASSERT_TRUE(std::isfinite(scale)) << GetParam() << ": bucket " << b << " scale " << scale << " step " << step;
    }
  }
}

// StateRoundTripsBetweenGpuAndCpu: saved state loads into a fresh compressor that continues bit-identically.
TEST_P(Reference, StateRoundTrips) {
  const std::size_t n = 10007;
  auto first = make_compressor(GetParam());
  auto reference = make_compressor(GetParam());
  CompressContext ctx;
  ctx.name = "s";
  for (std::uint64_t step = 0; step < 2; ++step) {
    ctx.step = step;
    const auto values = parity::random_values(n, static_cast<unsigned>(step + 3));
    compress_to_vector(*first, TensorView::of(std::span<const float>(values)), ctx);
    compress_to_vector(*reference, TensorView::of(std::span<const float>(values)), ctx);
  }
  auto resumed = make_compressor(GetParam());
  resumed->load_state(first->save_state());
  ctx.step = 2;
  const auto values = parity::random_values(n, 99);
  EXPECT_EQ(compress_to_vector(*resumed, TensorView::of(std::span<const float>(values)), ctx),
            compress_to_vector(*reference, TensorView::of(std::span<const float>(values)), ctx))
      << GetParam();
}

// The sizes reach the paths they are there for: every dgc spec samples (more than its 1,024-draw minimum) at
// kGridStrideSize, so the GPU parity covers the sampled threshold, not only the exact fall-back.
TEST(ReferenceSizes, DgcTakesTheSampledPathAtTheLargestSize) {
  std::size_t dgc_specs = 0;
  for (const auto& spec : parity::specs()) {
    if (spec.rfind("dgc", 0) != 0) continue;
    ++dgc_specs;
    auto compressor = make_compressor(spec);
    auto* ef = dynamic_cast<ErrorFeedbackCompressor*>(compressor.get());
    ASSERT_NE(ef, nullptr);
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto& values = step_values(parity::kGridStrideSize, step);
      compress_to_vector(*compressor,
                         TensorView::of(std::span<const float>(values.data(), parity::kGridStrideSize)),
                         parity_context(step));
      const TensorState* state = ef->state_of("layer.weight");
      ASSERT_NE(state, nullptr);
      ASSERT_EQ(state->scalars.size(), static_cast<std::size_t>(kDgcScalarCount));
      EXPECT_GT(state->scalars[kDgcSampledCount], 0.0) << spec << " step " << step << ": not sampled";
      EXPECT_GT(state->scalars[kDgcThreshold], 0.0) << spec << " step " << step;
    }
  }
  EXPECT_GE(dgc_specs, 2u);
}

INSTANTIATE_TEST_SUITE_P(Codecs, Reference, ::testing::ValuesIn(parity::specs()), parity::test_name);

// Coverage.EveryBuiltinCodecHasACudaPath probes the registry; its CPU half: every registered codec is in the parity
// list, so the GPU comparison reaches it. Rounds codecs (powersgd) have no one-call CUDA compress(); their device
// path is compared by tests/gpu/lowrank_ops_gpu_test.cc and tests/gpu/powersgd_gpu_test.cc.
TEST(ReferenceCoverage, EveryBuiltinCodecIsInTheParityList) {
  std::vector<std::string> missing;
  for (const auto& info : default_registry().list()) {
    if (info.traits.rounds) continue;
    bool found = false;
    for (const auto& spec : parity::specs()) found |= spec.substr(0, spec.find(':')) == info.name;
    if (!found) missing.push_back(info.name);
  }
  EXPECT_TRUE(missing.empty()) << "codecs missing from tests/gpu/parity_specs.inc: "
                               << ::testing::PrintToString(missing);
}

}  // namespace
}  // namespace gradcomp
