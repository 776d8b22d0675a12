// QSGD: unbiasedness, the paper's variance bound (and the exact variance), payload layout, parameter validation,
// the AVX2 loops against the per-element functions, and the shared quantizer checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "compressors/codecs/quantize_common.h"
#include "kernels/bitpack_ops.cuh"
#include "kernels/philox_cpu.h"
#include "kernels/qsgd_ops.cuh"
#include "quantizer_checks.h"

namespace gradcomp::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Qsgd, QuantizerChecks,
                         ::testing::Values("qsgd:bits=4", "qsgd:bits=2,bucket=128", "qsgd:bits=8,scale=l2",
                                           "qsgd:bits=3,bucket=64,seed=7", "qsgd:bits=5,ef=off"));

// Mean and E||Q(v) - v||^2 of `steps` independent quantizations of v (ef=off; the step keys the Philox stream).
struct Moments {
  std::vector<double> mean;
  double mse = 0.0;
};
Moments moments(const std::string& spec, const std::vector<float>& v, int steps) {
  auto codec = make_codec(spec);
  Moments m;
  m.mean.assign(v.size(), 0.0);
  for (int step = 0; step < steps; ++step) {
    const auto q = decode(*codec, compress(*codec, v, static_cast<std::uint64_t>(step)), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      m.mean[i] += q[i];
      m.mse += (static_cast<double>(q[i]) - v[i]) * (static_cast<double>(q[i]) - v[i]);
    }
  }
  for (auto& x : m.mean) x /= steps;
  m.mse /= steps;
  return m;
}

TEST(Qsgd, UnbiasedMeanConvergesToInput) {
  const std::size_t d = 512;
  const int steps = 4000;
  for (const char* spec : {"qsgd:bits=4,ef=off", "qsgd:bits=2,ef=off", "qsgd:bits=4,scale=l2,ef=off"}) {
    const auto v = normal_values(d, 21);
    const auto m = moments(spec, v, steps);
    double scale = 0.0, l2 = 0.0;
    for (float x : v) {
      scale = std::max(scale, static_cast<double>(std::fabs(x)));
      l2 += static_cast<double>(x) * x;
    }
    if (std::string(spec).find("l2") != std::string::npos) scale = std::sqrt(l2);
    const unsigned bits = std::string(spec).find("bits=2") != std::string::npos ? 2 : 4;
    const double unit = scale / kernels::signmag_levels(bits);
    // Each draw is floor or ceil of x in units: its variance is unit^2 p(1-p) <= unit^2 / 4, so the mean of `steps`
    // draws has standard error <= unit / (2 sqrt(steps)). A tolerance of 6 standard errors (3 unit / sqrt(steps),
    // 0.047 unit here) bounds all 512 elements with overwhelming probability, while deterministic rounding (bias up
    // to unit / 2) or a wrong rounding probability (bias of order unit) fails by a factor of ten or more.
    const double tolerance = 3.0 * unit / std::sqrt(static_cast<double>(steps));
    for (std::size_t i = 0; i < d; ++i) ASSERT_NEAR(m.mean[i], v[i], tolerance) << spec << " index " << i;
  }
}

TEST(Qsgd, VarianceWithinThePapersBound) {
  // Alistarh et al. 2017, Lemma 3.1: E||Q_s(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 per bucket of d values with
  // s levels and the l2 scale. With the max scale (<= ||v||_2) every element's variance unit^2 p(1-p) only shrinks,
  // so the same bound holds. We also compare against the exact expectation sum unit^2 p(1-p) (within 5 %: the
  // relative standard error of a mean of 2000 squared errors is about 2 % here).
  const std::size_t d = 512;
  const int steps = 2000;
  for (const char* scale_kind : {"max", "l2"}) {
    for (unsigned bits : {2u, 4u, 8u}) {
      for (int shape = 0; shape < 2; ++shape) {
        auto v = normal_values(d, 31 + bits);
        if (shape == 1) {  // sparse-ish: most entries small
          for (std::size_t i = 0; i < d; ++i) v[i] = (i % 16 == 0) ? v[i] * 10.0f : v[i] * 0.01f;
        }
        const std::string spec = fmt::format("qsgd:bits={},bucket=512,scale={},ef=off", bits, scale_kind);
        const auto m = moments(spec, v, steps);
        double l2 = 0.0, mx = 0.0;
        for (float x : v) {
          l2 += static_cast<double>(x) * x;
          mx = std::max(mx, static_cast<double>(std::fabs(x)));
        }
        const double s = kernels::signmag_levels(bits);
        const double bound = std::min(d / (s * s), std::sqrt(static_cast<double>(d)) / s) * l2;
        EXPECT_LE(m.mse, bound) << spec << " shape " << shape;
        const double scale = std::string(scale_kind) == "l2" ? std::sqrt(l2) : mx;
        const double unit = scale / s;
        double exact = 0.0;
        for (float x : v) {
          const double t = std::fabs(x) / unit;
          const double p = t - std::floor(t);
          exact += unit * unit * p * (1.0 - p);
        }
        EXPECT_NEAR(m.mse, exact, 0.05 * exact) << spec << " shape " << shape;
      }
    }
  }
}

TEST(Qsgd, PayloadLayout) {
  auto codec = make_codec("qsgd:bits=4,bucket=512");
  const auto v = normal_values(1000, 2);
  const auto payload = compress(*codec, v, 0);
  const auto view = payload::parse(payload, payload::CodecId::kQsgd, 1000);
  EXPECT_EQ(view.header.param0, 4u);      // bits | scale kind << 8 (max = 0)
  EXPECT_EQ(view.header.param1, 512u);    // bucket
  EXPECT_EQ(view.sections[0].size(), 8u);  // 2 buckets * f32
  EXPECT_EQ(view.sections[1].size(), 500u);
  EXPECT_EQ(payload.size(), codec->max_payload_bytes(1000));
  float scales[2];
  std::memcpy(scales, view.sections[0].data(), 8);
  float max0 = 0.0f, max1 = 0.0f;
  for (std::size_t i = 0; i < 512; ++i) max0 = std::max(max0, std::fabs(v[i]));
  for (std::size_t i = 512; i < 1000; ++i) max1 = std::max(max1, std::fabs(v[i]));
  EXPECT_EQ(scales[0], max0);
  EXPECT_EQ(scales[1], max1);
  // Every decoded value is a multiple of its bucket's unit, with |level| <= 7, and codes follow the per-element math.
  const auto stream = kernels::PhiloxStream::make(0, kernels::fnv1a64("layer.weight", 12), 0);
  const auto* packed = reinterpret_cast<const std::uint8_t*>(view.sections[1].data());
  const auto out = decode(*codec, payload, 1000);
  for (std::size_t i = 0; i < 1000; ++i) {
    const float scale = scales[i / 512];
    const std::uint32_t expected = kernels::signmag_quantize(
        v[i], kernels::signmag_inverse_unit(scale, 7), 7, 4, kernels::signmag_uniform(stream.bits(i / 2), i));
    const std::uint32_t code = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
    ASSERT_EQ(code, expected) << i;
    ASSERT_EQ(out[i], kernels::signmag_dequantize(code, kernels::signmag_unit(scale, 7), 4)) << i;
  }
}

TEST(Qsgd, HeaderParametersMustMatchTheDecoder) {
  const auto v = normal_values(2048, 8);
  auto four = make_codec("qsgd:bits=4");
  const auto payload = compress(*four, v, 0);
  for (const char* other : {"qsgd:bits=8", "qsgd:bits=4,bucket=256", "qsgd:bits=4,scale=l2"}) {
    auto codec = make_codec(other);
    std::vector<float> out(v.size(), 5.0f);
    EXPECT_THROW(codec->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite),
                 CorruptPayload)
        << other;
    for (float x : out) ASSERT_EQ(x, 5.0f);
  }
  // Bad scales: negative, NaN without the non-finite flag, infinite.
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto corrupt = payload;
    std::memcpy(corrupt.data() + payload::kHeaderBytes + 4, &bad, 4);
    std::vector<float> out(v.size(), 5.0f);
    EXPECT_THROW(four->decompress(corrupt, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite),
                 CorruptPayload)
        << bad;
    for (float x : out) ASSERT_EQ(x, 5.0f);
  }
  // Another codec's payload.
  auto onebit = make_codec("onebit");
  EXPECT_THROW(decode(*four, compress(*onebit, v, 0), v.size()), CorruptPayload);
}

TEST(Qsgd, ParameterValidation) {
  EXPECT_THROW(make_compressor("qsgd:bits=1"), InvalidArgument);
  EXPECT_THROW(make_compressor("qsgd:bits=9"), InvalidArgument);
  EXPECT_THROW(make_compressor("qsgd:bucket=100"), InvalidArgument);  // not a multiple of 8
  EXPECT_THROW(make_compressor("qsgd:bucket=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("qsgd:scale=l1"), InvalidArgument);
  try {
    make_compressor("qsgd:bucket=100");
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("multiple of 8"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(make_compressor("qsgd")->traits().requantizable);
  EXPECT_EQ(make_compressor("qsgd")->spec(), "qsgd:bits=4,bucket=512,scale=max,seed=0,ef=on,nonfinite=raise");
}

TEST(Qsgd, SeedAndStepChangeTheRandomness) {
  const auto v = normal_values(4096, 12);
  auto a = make_codec("qsgd:ef=off");
  auto b = make_codec("qsgd:ef=off,seed=1");
  EXPECT_NE(compress(*a, v, 0), compress(*b, v, 0));
  EXPECT_NE(compress(*a, v, 0), compress(*a, v, 1));
  EXPECT_EQ(compress(*a, v, 3), compress(*a, v, 3));
  EXPECT_NE(compress(*a, v, 0, "x"), compress(*a, v, 0, "y"));
}

TEST(Qsgd, PhiloxFillMatchesStreamBits) {
  const auto stream = kernels::PhiloxStream::make(5, 77, 0xFFFFFFFF0ull);
  for (std::uint64_t first : {0ull, 4ull, 1000ull, (1ull << 34) - 8}) {
    for (std::size_t count : {1u, 3u, 32u, 33u, 100u, 257u}) {
      std::vector<std::uint32_t> out(count);
      kernels::philox_fill(stream, first, count, out.data());
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], stream.bits(first + i)) << first << "+" << i;
    }
  }
}

TEST(Qsgd, PackUnpackRoundTrip) {
  for (unsigned bits = 1; bits <= 8; ++bits) {
    std::uint8_t codes[8], back[8], bytes[16] = {};
    for (unsigned k = 0; k < 8; ++k) codes[k] = static_cast<std::uint8_t>((k * 37 + bits) & ((1u << bits) - 1));
    kernels::pack8(codes, bits, bytes);
    kernels::unpack8(bytes, bits, back);
    for (unsigned k = 0; k < 8; ++k) ASSERT_EQ(back[k], codes[k]) << bits;
  }
}

}  // namespace
}  // namespace gradcomp::testing
