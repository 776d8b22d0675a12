// The CPU sign-magnitude kernels (compressors/codecs/signmag_cpu.h, philox_cpu.h, bucket_reduce.h) against the scalar
// per-element functions of kernels/*_ops.cuh, bit for bit: every width, with and without a residual, in place and
// ping-pong, plain and non-temporal stores at 16- and 32-byte alignment, ranges with tails, and edge-case scales. The
// AVX2 fast paths (2- and 4-bit codes, 64 values per step) must give exactly what the CUDA kernels compute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/bitpack_ops.cuh"
#include "kernels/bucket_reduce.h"
#include "kernels/philox_cpu.h"
#include "kernels/qsgd_ops.cuh"
#include "compressors/codecs/signmag_cpu.h"
#include "kernels/stream_store.h"

namespace gradcomp::kernels {
namespace {

// 64-byte aligned float storage with `offset` floats of padding in front (offset 4: 16 mod 32 bytes).
class Floats {
 public:
  Floats(std::size_t n, std::size_t offset)
      : memory_(static_cast<float*>(std::aligned_alloc(64, ((n + offset) * sizeof(float) + 63) / 64 * 64 + 64))),
        data_(memory_.get() + offset),
        n_(n) {}
  float* data() { return data_; }
  float& operator[](std::size_t i) { return data_[i]; }
  std::size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> memory_;
  float* data_;
  std::size_t n_;
};

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Code i of a little-endian packed bit stream of `bits`-wide codes.
std::uint32_t code_at(const std::vector<std::uint8_t>& packed, std::size_t i, unsigned bits) {
  std::uint32_t code = 0;
  for (unsigned b = 0; b < bits; ++b) {
    const std::size_t bit = i * bits + b;
    code |= static_cast<std::uint32_t>((packed[bit / 8] >> (bit % 8)) & 1u) << b;
  }
  return code;
}

TEST(SignMagKernels, PhiloxAvx2MatchesTheScalarStream) {
#if defined(__AVX2__)
  const auto stream = PhiloxStream::make(11, 0xABCDEF, (1ull << 33) + 5);
  const PhiloxAvx2 philox(stream);
  // Includes a batch whose low counter word wraps (the high word must carry per block).
  for (std::uint64_t first : {0ull, 1ull, 777ull, (1ull << 32) - 3, (1ull << 40) + 9}) {
    std::uint32_t draws[32];
    philox.fill32(first, draws);
    for (int k = 0; k < 32; ++k) ASSERT_EQ(draws[k], stream.bits(4 * first + k)) << first << " " << k;
    alignas(32) float u[64];
    philox.uniforms64(first, u);
    for (std::uint64_t e = 0; e < 64; ++e) {
      const std::uint64_t index = 8 * first + e;
      ASSERT_EQ(bits_of(u[e]), bits_of(signmag_uniform(stream.bits(index / 2), index))) << first << " " << e;
    }
  }
#else
  // Without AVX2 only the scalar generator exists: check the batched fill that the tile loop uses.
  const auto stream = PhiloxStream::make(11, 0xABCDEF, (1ull << 33) + 5);
  std::uint32_t draws[40];
  philox_fill(stream, 4 * ((1ull << 32) - 3), 40, draws);
  for (int k = 0; k < 40; ++k) ASSERT_EQ(draws[k], stream.bits(4 * ((1ull << 32) - 3) + k)) << k;
#endif
}

struct QuantizeCase {
  unsigned bits;
  std::size_t begin, end;  // range inside a tensor of `end + 16` elements
  float scale;             // 0: use max |v| of the range
};

// Runs SignMagQuantizer::quantize on one range and checks codes, residual and untouched neighbours against the
// scalar functions.
void check_quantize(const QuantizeCase& c, const std::vector<float>& g_values, const std::vector<float>& r_values,
                    int residual_mode, bool stream, std::size_t offset) {
  const std::size_t n = c.end + 16;
  Floats g(n, offset), r(n, offset), r_out(n, offset);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = g_values[i];
    r[i] = r_values[i];
    r_out[i] = -7.0f;
  }
  const bool has_r = residual_mode != 0;
  float* out_ptr = residual_mode == 2 ? r_out.data() : r.data();  // 1: in place, 2: ping-pong
  float scale = c.scale;
  if (scale == 0.0f) {
    for (std::size_t i = c.begin; i < c.end; ++i) scale = std::max(scale, std::fabs(g[i] + (has_r ? r[i] : 0.0f)));
  }
  const auto stream_key = PhiloxStream::make(3, 0x1234, 42);
  std::vector<std::uint8_t> packed(packed_bytes(n, c.bits) + 8, 0xA5);
  const SignMagQuantizer quantizer(c.bits, stream_key);
  quantizer.quantize(g.data(), has_r ? r.data() : nullptr, has_r ? out_ptr : nullptr, c.begin, c.end, scale,
                     packed.data(), stream && has_r);
  stream_fence(stream);
  const std::uint32_t levels = signmag_levels(c.bits);
  const float unit = signmag_unit(scale, levels), inverse = signmag_inverse_unit(scale, levels);
  for (std::size_t i = c.begin; i < c.end; ++i) {
    const float v = has_r ? g_values[i] + r_values[i] : g_values[i];
    const std::uint32_t expected =
        signmag_quantize(v, inverse, levels, c.bits, signmag_uniform(stream_key.bits(i / 2), i));
    ASSERT_EQ(code_at(packed, i, c.bits), expected) << "bits " << c.bits << " i " << i << " v " << v;
    if (has_r) {
      const float residual = v - signmag_dequantize(expected, unit, c.bits);
      ASSERT_EQ(bits_of(out_ptr[i]), bits_of(residual)) << "bits " << c.bits << " i " << i;
    }
  }
  // Nothing outside the range is written: packed bytes before begin / after end, residuals outside.
  for (std::size_t b = 0; b < c.begin * c.bits / 8; ++b) ASSERT_EQ(packed[b], 0xA5) << b;
  for (std::size_t b = packed_bytes(c.end, c.bits); b < packed.size(); ++b) ASSERT_EQ(packed[b], 0xA5) << b;
  for (std::size_t i = 0; i < n; ++i) {
    if (i >= c.begin && i < c.end) continue;
    if (residual_mode == 2) {
      ASSERT_EQ(r_out[i], -7.0f) << i;
    }
    ASSERT_EQ(bits_of(r[i]), bits_of(r_values[i])) << i;
  }
  if (residual_mode == 2) {
    for (std::size_t i = c.begin; i < c.end; ++i) ASSERT_EQ(bits_of(r[i]), bits_of(r_values[i])) << i;
  }
}

TEST(SignMagKernels, QuantizeMatchesScalarForEveryWidthAndStoreKind) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t max_n = 2000 + 16;
  std::vector<float> g(max_n), r(max_n);
  for (std::size_t i = 0; i < max_n; ++i) {
    g[i] = normal(rng);
    r[i] = 0.1f * normal(rng);
    if (i % 13 == 0) g[i] = -0.0f;
    if (i % 17 == 0) g[i] = 0.0f;
  }
  const std::vector<QuantizeCase> cases = {
      {4, 0, 512, 0.0f},   {4, 8, 520, 0.0f},  {4, 64, 64 + 72, 0.0f}, {4, 0, 1000, 0.0f}, {4, 0, 1003, 0.0f},
      {4, 0, 64, 1e-3f},   {4, 0, 128, 1e-38f}, {4, 0, 128, 1e-44f},   {4, 0, 64, 0.5f},   {2, 0, 512, 0.0f},
      {2, 8, 200, 0.0f},   {2, 0, 1001, 0.0f},  {2, 0, 128, 1e-40f},   {3, 0, 512, 0.0f},  {5, 0, 200, 0.0f},
      {6, 8, 512, 0.0f},   {7, 0, 129, 0.0f},   {8, 0, 1000, 0.0f},    {8, 0, 64, 1e-38f},
  };
  for (const auto& c : cases) {
    for (int residual_mode : {0, 1, 2}) {
      for (bool stream : {false, true}) {
        for (std::size_t offset : {0u, 4u, 1u}) {
          if (stream && offset % 4 != 0) continue;  // non-temporal stores need 16-byte alignment
          SCOPED_TRACE(::testing::Message() << "bits " << c.bits << " [" << c.begin << ", " << c.end << ") scale "
                                            << c.scale << " residual " << residual_mode << " stream " << stream
                                            << " offset " << offset);
          check_quantize(c, g, r, residual_mode, stream, offset);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(SignMagKernels, QuantizeEdgeValuesAtTheScale) {
  // Values exactly at +-scale (x = levels), at +-unit, zeros of both signs, with a bucket of all-equal magnitudes.
  for (unsigned bits : {2u, 4u, 8u}) {
    std::vector<float> g(512 + 16), r(512 + 16, 0.0f);
    const float scale = 0.75f, unit = scale / static_cast<float>(signmag_levels(bits));
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float choices[] = {scale, -scale, unit, -unit, 0.0f, -0.0f, 0.5f * unit, scale * 0.999999f};
      g[i] = choices[i % 8];
    }
    check_quantize({bits, 0, 512, scale}, g, r, 1, false, 0);
    check_quantize({bits, 0, 512, 0.0f}, std::vector<float>(512 + 16, 0.0f), r, 2, true, 0);  // all-zero bucket
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(SignMagKernels, DecodeMatchesScalarForEveryWidthAndStoreKind) {
  std::mt19937 rng(9);
  for (unsigned bits = 2; bits <= 8; ++bits) {
    for (std::size_t length : {8u, 16u, 24u, 64u, 512u, 1000u, 1003u}) {
      for (std::size_t begin : {0u, 8u, 16u}) {
        const std::size_t end = begin + length;
        std::vector<std::uint8_t> packed(packed_bytes(end, bits));
        for (auto& b : packed) b = static_cast<std::uint8_t>(rng());
        for (float scale : {0.3f, 0.0f, 1e-40f, std::numeric_limits<float>::quiet_NaN()}) {
          const float unit = signmag_unit(scale, signmag_levels(bits));
          for (bool accumulate : {false, true}) {
            for (bool stream : {false, true}) {
              for (std::size_t offset : {0u, 4u, 3u}) {
                if (stream && (accumulate || offset % 4 != 0)) continue;
                Floats out(end + 8, offset);
                for (std::size_t i = 0; i < end + 8; ++i) out[i] = 0.5f + static_cast<float>(i);
                signmag_decode_range(packed.data(), begin, end, scale, bits, out.data(), accumulate, stream);
                stream_fence(stream);
                for (std::size_t i = 0; i < end + 8; ++i) {
                  const float before = 0.5f + static_cast<float>(i);
                  float expected = before;
                  if (i >= begin && i < end) {
                    const float value = signmag_dequantize(code_at(packed, i, bits), unit, bits);
                    expected = accumulate ? before + value : value;
                  }
                  ASSERT_EQ(bits_of(out[i]), bits_of(expected))
                      << "bits " << bits << " [" << begin << ", " << end << ") i " << i << " scale " << scale
                      << " accumulate " << accumulate << " stream " << stream << " offset " << offset;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(SignMagKernels, BucketStatsFastMaxMatchesTheExactLoop) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 512u, 517u}) {
    for (int poison = 0; poison < 4; ++poison) {  // none, +inf in g, NaN in r, overflow of g + r
      std::vector<float> g(n), r(n);
      for (std::size_t i = 0; i < n; ++i) {
        g[i] = normal(rng);
        r[i] = normal(rng);
      }
      if (n > 0 && poison == 1) g[n / 2] = inf;
      if (n > 0 && poison == 2) r[n - 1] = nan;
      if (n > 0 && poison == 3) g[0] = r[0] = 3e38f;
      for (const float* rp : {static_cast<const float*>(nullptr), static_cast<const float*>(r.data())}) {
        const auto fast = bucket_stats<kStatMax>(g.data(), rp, n);
        const auto exact = detail::bucket_stats_exact<kStatMax>(g.data(), rp, n);
        EXPECT_EQ(bits_of(fast.max_abs), bits_of(exact.max_abs)) << n << " " << poison;
        EXPECT_EQ(fast.nonfinite, exact.nonfinite) << n << " " << poison;
        const auto fast_sq = bucket_stats<kStatMax | kStatSq>(g.data(), rp, n);
        const auto exact_sq = detail::bucket_stats_exact<kStatMax | kStatSq>(g.data(), rp, n);
        EXPECT_EQ(bits_of(fast_sq.max_abs), bits_of(exact_sq.max_abs)) << n << " " << poison;
        EXPECT_EQ(bits_of(fast_sq.sum_sq), bits_of(exact_sq.sum_sq)) << n << " " << poison;
        EXPECT_EQ(fast_sq.nonfinite, exact_sq.nonfinite) << n << " " << poison;
      }
    }
  }
}

}  // namespace
}  // namespace gradcomp::kernels
