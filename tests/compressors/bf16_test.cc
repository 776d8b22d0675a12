// bf16: round to nearest even against an independent reference, round-trip bounds, overflow saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/fp16_ops.cuh"
#include "quantizer_checks.h"

namespace gradcomp::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Bf16, QuantizerChecks, ::testing::Values("bf16:ef=on", "bf16:ef=off"));

// Reference: the nearer of the two bf16 neighbours (by exact double arithmetic), ties to the even one.
std::uint16_t reference_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const std::uint32_t down = bits >> 16, up = down + 1;
  auto as_double = [](std::uint32_t b16) {
    const std::uint32_t b = b16 << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return static_cast<double>(f);
  };
  const double d_down = std::fabs(value - as_double(down)), d_up = std::fabs(as_double(up) - value);
  if (d_down < d_up) return static_cast<std::uint16_t>(down);
  if (d_up < d_down) return static_cast<std::uint16_t>(up);
  return static_cast<std::uint16_t>((down & 1) ? up : down);
}

TEST(Bf16, RoundsToNearestEven) {
  auto codec = make_codec("bf16:ef=off");
  std::mt19937 rng(4);
  std::vector<float> grad;
  for (int i = 0; i < 50000; ++i) {
    std::uint32_t bits = rng();
    if ((bits & 0x7FFFFFFFu) >= 0x7F7F0000u) bits &= 0xBFFFFFFFu;  // finite, and rounding cannot overflow
    if (i % 7 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;  // exact ties
    float v;
    std::memcpy(&v, &bits, 4);
    grad.push_back(v);
  }
  const auto payload = compress(*codec, grad, 0);
  std::vector<std::uint16_t> body(grad.size());
  std::memcpy(body.data(), payload.data() + payload::kHeaderBytes, body.size() * 2);
  for (std::size_t i = 0; i < grad.size(); ++i) ASSERT_EQ(body[i], reference_bf16(grad[i])) << grad[i];
  const auto out = decode(*codec, payload, grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) {
    // 8-bit significand (7 stored): error <= half an ulp = 2^-8 of the binade, so <= 2^-8 |x| (subnormals: 2^-134).
    ASSERT_LE(std::fabs(static_cast<double>(out[i]) - grad[i]), std::fabs(grad[i]) * 0x1p-8 + 0x1p-134) << grad[i];
  }
  EXPECT_EQ(codec->last_stats().saturated, 0u);
  EXPECT_EQ(codec->traits().wire_dtype, DType::kBF16);
}

TEST(Bf16, OverflowingRoundingSaturatesAndIsCounted) {
  auto codec = make_codec("bf16");
  const std::vector<float> grad = {3.4028234e38f, -3.0e38f, 1.0f};  // the first rounds past the largest bf16
  const auto out = decode(*codec, compress(*codec, grad, 0), grad.size());
  EXPECT_EQ(codec->last_stats().saturated, 1u);
  EXPECT_EQ(out[0], kernels::kBf16Max);
  EXPECT_TRUE(std::isfinite(out[1]));
  EXPECT_EQ(out[2], 1.0f);
}

TEST(Bf16, ErrorFeedbackRecoversSmallValues) {
  // 1 + 2^-10 is not representable in bf16; with error feedback its sum over steps is still transmitted.
  auto codec = make_codec("bf16");
  const std::vector<float> grad = {1.0f + 0x1p-10f};
  double sent = 0.0;
  for (std::uint64_t step = 0; step < 256; ++step) sent += decode(*codec, compress(*codec, grad, step), 1)[0];
  EXPECT_NEAR(sent, 256.0 * grad[0], 0x1p-7);
  auto no_ef = make_codec("bf16:ef=off");
  double sent_no_ef = 0.0;
  for (std::uint64_t step = 0; step < 256; ++step) sent_no_ef += decode(*no_ef, compress(*no_ef, grad, step), 1)[0];
  EXPECT_EQ(sent_no_ef, 256.0);  // without error feedback the 2^-10 is lost every step
}

}  // namespace
}  // namespace gradcomp::testing
