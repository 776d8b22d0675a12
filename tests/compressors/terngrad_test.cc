// TernGrad: ternary values, unbiasedness without clipping, the documented clipping bias, whole-tensor scale,
// parameter validation, and the shared quantizer checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "quantizer_checks.h"

namespace gradcomp::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(TernGrad, QuantizerChecks,
                         ::testing::Values("terngrad", "terngrad:clip=0", "terngrad:bucket=0",
                                           "terngrad:bucket=128,seed=3", "terngrad:ef=off"));

std::vector<double> mean_of(const std::string& spec, const std::vector<float>& v, int steps) {
  auto codec = make_codec(spec);
  std::vector<double> mean(v.size(), 0.0);
  for (int step = 0; step < steps; ++step) {
    const auto q = decode(*codec, compress(*codec, v, static_cast<std::uint64_t>(step)), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) mean[i] += q[i];
  }
  for (auto& x : mean) x /= steps;
  return mean;
}

TEST(TernGrad, ValuesAreTernaryPerBucket) {
  auto codec = make_codec("terngrad:clip=0,bucket=256");
  const auto v = normal_values(1000, 4);
  const auto out = decode(*codec, compress(*codec, v, 0), v.size());
  for (std::size_t b = 0; b < 1000; b += 256) {
    float mx = 0.0f;
    for (std::size_t i = b; i < std::min<std::size_t>(1000, b + 256); ++i) mx = std::max(mx, std::fabs(v[i]));
    std::set<float> seen;
    for (std::size_t i = b; i < std::min<std::size_t>(1000, b + 256); ++i) {
      ASSERT_TRUE(out[i] == 0.0f || std::fabs(out[i]) == mx) << i << " " << out[i];
      if (out[i] != 0.0f) {
        ASSERT_EQ(std::signbit(out[i]), std::signbit(v[i])) << i;
      }
      seen.insert(out[i]);
    }
    EXPECT_GE(seen.size(), 2u);
  }
  EXPECT_LE(compress(*codec, v, 1).size(), payload::kHeaderBytes + 16 + 250 + 16);  // 2 bits/value + 4 scales
}

TEST(TernGrad, UnbiasedWithoutClipping) {
  const auto v = normal_values(512, 5);
  const int steps = 4000;
  const auto mean = mean_of("terngrad:clip=0,ef=off", v, steps);
  float mx = 0.0f;
  for (float x : v) mx = std::max(mx, std::fabs(x));
  // Each draw is 0 or +-S with P = |v|/S: variance <= S^2 / 4, so the standard error of the mean is
  // <= S / (2 sqrt(steps)); 6 standard errors = 3 S / sqrt(steps) (0.047 S). A biased rounding fails by far more.
  const double tolerance = 3.0 * mx / std::sqrt(static_cast<double>(steps));
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(mean[i], v[i], tolerance) << i;
}

TEST(TernGrad, ClippingBiasIsTowardTheClippedValue) {
  // Documented bias: with clip > 0 the expectation is clip(v, -S, S) with S = min(max|v|, clip * rms(v)).
  auto v = normal_values(512, 6);
  v[10] = 40.0f;  // an outlier far beyond 2.5 sigma
  v[11] = -35.0f;
  double sq = 0.0;
  float mx = 0.0f;
  for (float x : v) {
    sq += static_cast<double>(x) * x;
    mx = std::max(mx, std::fabs(x));
  }
  const double s = std::min<double>(mx, 2.5 * std::sqrt(sq / 512.0));
  ASSERT_LT(s, 35.0);
  const int steps = 4000;
  const auto mean = mean_of("terngrad:clip=2.5,ef=off", v, steps);
  const double tolerance = 3.0 * s / std::sqrt(static_cast<double>(steps));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double clipped = std::clamp<double>(v[i], -s, s);
    ASSERT_NEAR(mean[i], clipped, tolerance) << i;
  }
  // With error feedback the clipped part is not lost: the running sum of what is sent tracks the sum of gradients.
  auto codec = make_codec("terngrad:clip=2.5");
  std::vector<double> sent(v.size(), 0.0);
  const int ef_steps = 200;
  for (int step = 0; step < ef_steps; ++step) {
    const auto q = decode(*codec, compress(*codec, v, static_cast<std::uint64_t>(step)), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) sent[i] += q[i];
  }
  const auto r = residual_of(*codec, "layer.weight", v.size());
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(sent[i] + r[i], ef_steps * static_cast<double>(v[i]), 1e-2);
  EXPECT_NEAR(sent[10] / ef_steps, 40.0, 1.0);  // the outlier gets through over time
}

TEST(TernGrad, WholeTensorScale) {
  auto codec = make_codec("terngrad:bucket=0,clip=0");
  const auto v = normal_values(200'000, 7);
  const auto payload = compress(*codec, v, 0);
  const auto view = payload::parse(payload, payload::CodecId::kTernGrad, 200'000);
  EXPECT_EQ(view.sections[0].size(), 4u);
  float scale;
  std::memcpy(&scale, view.sections[0].data(), 4);
  float mx = 0.0f;
  for (float x : v) mx = std::max(mx, std::fabs(x));
  EXPECT_EQ(scale, mx);
  for (float x : decode(*codec, payload, v.size())) ASSERT_TRUE(x == 0.0f || std::fabs(x) == mx);
}

TEST(TernGrad, ParameterValidation) {
  EXPECT_THROW(make_compressor("terngrad:bucket=12"), InvalidArgument);
  EXPECT_THROW(make_compressor("terngrad:clip=-1"), InvalidArgument);
  auto bucketed = make_codec("terngrad:bucket=256");
  auto whole = make_codec("terngrad:bucket=0");
  const auto v = normal_values(1000, 1);
  std::vector<float> out(v.size());
  EXPECT_THROW(whole->decompress(compress(*bucketed, v, 0), TensorView::of(std::span<float>(out)),
                                 DecodeMode::kOverwrite),
               CorruptPayload);
  EXPECT_TRUE(make_compressor("terngrad")->traits().requantizable);
}

}  // namespace
}  // namespace gradcomp::testing
