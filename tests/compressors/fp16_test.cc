// fp16: round-trip bounds, saturation reporting, prescale, and the F16C loop against the per-element function.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/fp16_ops.cuh"
#include "compressors/codecs/half_cpu.h"
#include "quantizer_checks.h"

namespace gradcomp::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Fp16, QuantizerChecks, ::testing::Values("fp16:ef=on", "fp16:ef=off", "fp16:prescale=0.25"));

std::vector<std::uint16_t> body_of(const std::vector<std::byte>& payload, std::size_t n) {
  std::vector<std::uint16_t> body(n);
  if (n) std::memcpy(body.data(), payload.data() + payload::kHeaderBytes, n * 2);
  return body;
}

TEST(Fp16, RoundTripWithinHalfAnUlp) {
  auto codec = make_codec("fp16:ef=off");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> exponent(-24.0f, 15.9f);
  std::vector<float> grad(20000);
  for (auto& v : grad) v = std::exp2(exponent(rng)) * (rng() & 1 ? 1.0f : -1.0f);
  const auto out = decode(*codec, compress(*codec, grad, 0), grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const float a = std::fabs(grad[i]);
    // Normal halves: relative error <= 2^-11 (half an ulp of an 11-bit significand); subnormals: absolute 2^-25.
    const double bound = a >= 0x1p-14f ? a * 0x1p-11 : 0x1p-25;
    ASSERT_LE(std::fabs(static_cast<double>(out[i]) - grad[i]), bound) << grad[i];
  }
  EXPECT_EQ(codec->last_stats().saturated, 0u);
}

TEST(Fp16, OverflowSaturatesAndIsCounted) {
  auto codec = make_codec("fp16:ef=on");
  std::vector<float> grad = {1.0e5f, -7.0e6f, 65504.0f, 65519.0f, 65520.0f, -3.0e38f, 2.0f};
  const auto payload = compress(*codec, grad, 0);
  EXPECT_EQ(codec->last_stats().saturated, 4u);  // 1e5, -7e6, 65520 (would round to inf), -3e38
  const auto out = decode(*codec, payload, grad.size());
  const std::vector<float> expected = {65504.0f, -65504.0f, 65504.0f, 65504.0f, 65504.0f, -65504.0f, 2.0f};
  EXPECT_EQ(out, expected);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  // Error feedback keeps what saturation dropped.
  const auto r = residual_of(*codec, "layer.weight", grad.size());
  EXPECT_FLOAT_EQ(r[0], 1.0e5f - 65504.0f);
  EXPECT_FLOAT_EQ(r[1], -7.0e6f + 65504.0f);
  EXPECT_EQ(r[6], 0.0f);
}

TEST(Fp16, PrescaleFromContextOrParameter) {
  const std::vector<float> grad = {1000.0f, -3.0f, 0.5f};
  auto from_ctx = make_codec("fp16");
  const auto out = decode(*from_ctx, compress(*from_ctx, grad, 0, "x", 0.25f), 3);
  EXPECT_EQ(out, (std::vector<float>{250.0f, -0.75f, 0.125f}));
  // The residual is in the unscaled domain: these values are exact in half, so nothing is left.
  for (float r : residual_of(*from_ctx, "x", 3)) EXPECT_EQ(r, 0.0f);
  auto fixed = make_codec("fp16:prescale=0.5");
  EXPECT_EQ(decode(*fixed, compress(*fixed, grad, 0, "x", 0.25f), 3), (std::vector<float>{500.0f, -1.5f, 0.25f}));
  // 1/world_size keeps a sum of 8 ranks' 60000 in range.
  auto eight = make_codec("fp16");
  const std::vector<float> big(1, 60000.0f);
  EXPECT_EQ(decode(*eight, compress(*eight, big, 0, "y", 0.125f), 1)[0], 7500.0f);
  EXPECT_EQ(eight->last_stats().saturated, 0u);
  EXPECT_THROW(make_compressor("fp16:prescale=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("fp16:prescale=-1"), InvalidArgument);
}

TEST(Fp16, VectorLoopMatchesElementFunctionBitForBit) {
  // Every half value, its midpoints to the next one (ties), and random floats across the whole f32 range.
  std::vector<float> values;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float a = kernels::half_bits_to_float(static_cast<std::uint16_t>(h));
    if (!std::isfinite(a)) continue;
    values.push_back(a);
    const float b = kernels::half_bits_to_float(static_cast<std::uint16_t>(h + 1));
    if (std::isfinite(b) && (h & 0x7FFF) != 0x7BFF) values.push_back(0.5f * (a + b));
  }
  std::mt19937 rng(9);
  for (int i = 0; i < 100000; ++i) {
    std::uint32_t bits = rng();
    float v;
    std::memcpy(&v, &bits, 4);
    values.push_back(v);
  }
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::quiet_NaN());
  std::vector<std::uint16_t> fast(values.size());
  const std::size_t saturated = kernels::half_encode_range<kernels::HalfFormat::kF16>(
      values.data(), nullptr, values.size(), 1.0f, fast.data());
  std::size_t expected_saturated = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(fast[i], kernels::fp16_encode(values[i])) << values[i];
    expected_saturated += kernels::fp16_saturates(values[i]);
  }
  EXPECT_EQ(saturated, expected_saturated);
  EXPECT_GT(saturated, 1000u);
  // Decoding: every half bit pattern.
  std::vector<std::uint16_t> all(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<std::uint16_t>(h);
  std::vector<float> decoded(all.size());
  kernels::half_decode_range<kernels::HalfFormat::kF16>(all.data(), all.size(), decoded.data(), false);
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float expected = kernels::fp16_decode(static_cast<std::uint16_t>(h));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(decoded[h]));
    } else {
      ASSERT_EQ(kernels::float_bits(decoded[h]), kernels::float_bits(expected)) << h;
    }
  }
}

TEST(Fp16, PayloadBodyIsPlainHalf) {
  auto codec = make_codec("fp16:ef=off");
  const std::vector<float> grad = {1.0f, -2.5f, 0.0f};
  const auto payload = compress(*codec, grad, 0);
  EXPECT_EQ(payload.size(), payload::kHeaderBytes + 6);
  EXPECT_EQ(body_of(payload, 3), (std::vector<std::uint16_t>{0x3C00, 0xC100, 0x0000}));
  EXPECT_TRUE(codec->traits().summable);
  EXPECT_EQ(codec->traits().wire_dtype, DType::kF16);
}

}  // namespace
}  // namespace gradcomp::testing
