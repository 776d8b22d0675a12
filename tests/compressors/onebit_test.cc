// 1-bit / EF-signSGD: sign and mean-|v| scale per bucket, the documented bias and its correction by error feedback,
// the AVX2 loops against the per-element functions, and the shared quantizer checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/onebit_ops.cuh"
#include "quantizer_checks.h"

namespace gradcomp::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(OneBit, QuantizerChecks,
                         ::testing::Values("onebit", "onebit:bucket=8", "onebit:bucket=4096", "onebit:ef=off"));

TEST(OneBit, SignTimesMeanAbsolutePerBucket) {
  auto codec = make_codec("onebit:bucket=512,ef=off");
  const auto v = normal_values(1300, 8);
  const auto payload = compress(*codec, v, 0);
  const auto view = payload::parse(payload, payload::CodecId::kOneBit, 1300);
  EXPECT_EQ(view.sections[0].size(), 12u);  // 3 buckets
  EXPECT_EQ(view.sections[1].size(), 163u);  // ceil(1300 / 8)
  const auto out = decode(*codec, payload, v.size());
  const auto* bits = reinterpret_cast<const std::uint8_t*>(view.sections[1].data());
  for (std::size_t b = 0; b < 1300; b += 512) {
    const std::size_t e = std::min<std::size_t>(1300, b + 512);
    double sum_abs = 0.0;
    for (std::size_t i = b; i < e; ++i) sum_abs += std::fabs(v[i]);
    const double scale = sum_abs / static_cast<double>(e - b);
    for (std::size_t i = b; i < e; ++i) {
      ASSERT_NEAR(std::fabs(out[i]), scale, scale * 1e-5) << i;
      ASSERT_EQ(std::signbit(out[i]), std::signbit(v[i])) << i;
      ASSERT_EQ((bits[i / 8] >> (i % 8)) & 1u, kernels::onebit_encode(v[i])) << i;
    }
  }
}

TEST(OneBit, BiasedPerStepButErrorFeedbackTracksTheSum) {
  // Documented: one step is biased (every value of a bucket has magnitude mean|v|); error feedback makes the sum of
  // what is sent track the sum of the gradients, up to the bounded residual.
  auto v = normal_values(512, 9);
  v[0] = 20.0f;
  auto codec = make_codec("onebit");
  auto no_ef = make_codec("onebit:ef=off");
  std::vector<double> sent(v.size(), 0.0), sent_no_ef(v.size(), 0.0);
  const int steps = 300;
  for (int step = 0; step < steps; ++step) {
    const auto q = decode(*codec, compress(*codec, v, static_cast<std::uint64_t>(step)), v.size());
    const auto q2 = decode(*no_ef, compress(*no_ef, v, static_cast<std::uint64_t>(step)), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      sent[i] += q[i];
      sent_no_ef[i] += q2[i];
    }
  }
  // Without error feedback the outlier is flattened to mean|v| (about 0.8) every step; with it, the residual of the
  // outlier raises the bucket's scale until much more of it gets through (the exact rate depends on the bucket).
  EXPECT_LT(sent_no_ef[0] / steps, 2.0);
  EXPECT_GT(sent[0] / steps, 4.0 * sent_no_ef[0] / steps);
  const auto r = residual_of(*codec, "layer.weight", v.size());
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(sent[i] + r[i], steps * static_cast<double>(v[i]), 1e-2);
}

TEST(OneBit, ParameterValidation) {
  EXPECT_THROW(make_compressor("onebit:bucket=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("onebit:bucket=100"), InvalidArgument);
  auto a = make_codec("onebit:bucket=512");
  auto b = make_codec("onebit:bucket=256");
  const auto v = normal_values(1000, 1);
  std::vector<float> out(v.size(), 3.0f);
  EXPECT_THROW(b->decompress(compress(*a, v, 0), TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite),
               CorruptPayload);
  for (float x : out) ASSERT_EQ(x, 3.0f);
  EXPECT_TRUE(make_compressor("onebit")->traits().requantizable);
}

}  // namespace
}  // namespace gradcomp::testing
