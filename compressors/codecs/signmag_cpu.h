// CPU loops of the sign-magnitude bucket quantizer behind QSGD and TernGrad: fused compensate (v = g + r), stochastic
// rounding, bit packing and residual update (r' = v - decoded). Per-element math: kernels/qsgd_ops.cuh; with AVX2 the
// same operations run 8 lanes wide (tests check them against the scalar functions bit for bit).
//
// With AVX2, 2- and 4-bit codes (TernGrad, QSGD's default) take a fast path of 64 values per step: the 8 Philox
// blocks of those values (PhiloxAvx2, one block = 8 uniforms) go straight into a 64-float buffer; the decoded
// magnitude is a lookup (_mm256_permutevar8x32_ps over level * unit for levels 0..7) instead of a conversion and a
// multiply; the sign is moved, not recomputed; and the 64 codes are packed with byte packs and multiply-adds instead
// of a horizontal reduction per 8 codes. The decoders look the value of each code up the same way. Other widths,
// and the tail of a range that is not a multiple of 64 (16 when decoding), use the 8-wide tile loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/bitpack_ops.cuh"
#include "kernels/philox_cpu.h"
#include "kernels/qsgd_ops.cuh"
#include "compressors/codecs/signmag_avx2.h"
#include "kernels/stream_store.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp::kernels {

inline constexpr std::size_t kSignMagTile = 256;

namespace detail {

#if defined(__AVX2__)
// Packs 8 codes (u32 lanes, each < 2^bits) into the low 8*bits bits of a word.
inline std::uint64_t pack8_avx2(__m256i codes, __m256i shifts, unsigned bits) {
  __m256i x = _mm256_sllv_epi32(codes, shifts);
  x = _mm256_or_si256(x, _mm256_shuffle_epi32(x, 0x4E));
  x = _mm256_or_si256(x, _mm256_shuffle_epi32(x, 0xB1));
  const std::uint64_t lo = static_cast<std::uint32_t>(_mm256_cvtsi256_si32(x));
  const std::uint64_t hi = static_cast<std::uint32_t>(_mm256_extract_epi32(x, 4));
  return lo | (hi << (4u * bits));
}

// Unpacks 8 codes from the low 8*bits bits of `word`.
inline __m256i unpack8_avx2(std::uint64_t word, __m256i shifts, __m256i mask, unsigned bits) {
  const auto lo = static_cast<int>(static_cast<std::uint32_t>(word));
  const auto hi = static_cast<int>(static_cast<std::uint32_t>(word >> (4u * bits)));
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi), shifts), mask);
}
#endif

// Codes of v = g + r (r may be null) for n <= kSignMagTile elements (the first one even); the new residual v - decoded
// goes to r_out (r itself for the in-place update; non-null whenever r is; `stream`: non-temporal stores, r_out
// 16-byte aligned, the caller fences); codes packed into `packed_tile` (which has room for 8 spare bytes). random[j]
// is the Philox draw of elements 2j and 2j + 1.
inline void quantize_tile(const float* g, const float* r, float* r_out, std::size_t n, const std::uint32_t* random,
                          float inverse, float unit, std::uint32_t levels, unsigned bits, std::uint8_t* packed_tile,
                          bool stream) {
  std::size_t i = 0;
#if defined(__AVX2__)
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 v_inverse = _mm256_set1_ps(inverse), v_unit = _mm256_set1_ps(unit);
  const __m256 v_levels_f = _mm256_set1_ps(static_cast<float>(levels));
  const __m256i v_levels = _mm256_set1_epi32(static_cast<int>(levels));
  const __m256 to_unit = _mm256_set1_ps(1.0f / 65536.0f);
  const int b = static_cast<int>(bits);
  const __m256i shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b);
  for (; inverse >= 0.0f && i + 8 <= n; i += 8) {  // a tiny scale's negated inverse: the scalar loop
    __m256 v = _mm256_loadu_ps(g + i);
    if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
    const __m256 x = _mm256_min_ps(_mm256_mul_ps(_mm256_and_ps(v, abs_mask), v_inverse), v_levels_f);
    // 4 draws = 8 16-bit halves, low half first: lane j gets signmag_uniform(random[(i + j) / 2], i + j).
    const __m256i halves = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(random + i / 2)));
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(halves), to_unit);
    const __m256i level = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(x, u)), v_levels);
    const __m256i sign = _mm256_srli_epi32(_mm256_castps_si256(v), 31);
    const __m256i code = _mm256_or_si256(_mm256_slli_epi32(sign, b - 1), level);
    const std::uint64_t word = pack8_avx2(code, shifts, bits);
    std::memcpy(packed_tile + i / 8 * bits, &word, sizeof(word));  // the next group overwrites the spare bytes
    if (r) {
      const __m256 magnitude = _mm256_mul_ps(_mm256_cvtepi32_ps(level), v_unit);
      const __m256 decoded = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(_mm256_slli_epi32(sign, 31)));
      store8(r_out + i, _mm256_sub_ps(v, decoded), stream);
    }
  }
#else
  (void)stream;
#endif
  std::uint8_t codes[8] = {};
  for (; i < n; i += 8) {
    const std::size_t m = std::min<std::size_t>(8, n - i);
    for (std::size_t j = 0; j < 8; ++j) codes[j] = 0;
    for (std::size_t j = 0; j < m; ++j) {
      const float v = r ? g[i + j] + r[i + j] : g[i + j];
      const std::uint32_t code = signmag_quantize(v, inverse, levels, bits, signmag_uniform(random[(i + j) / 2], i + j));
      codes[j] = static_cast<std::uint8_t>(code);
      if (r) r_out[i + j] = v - signmag_dequantize(code, unit, bits);
    }
    pack8(codes, bits, packed_tile + i / 8 * bits);
  }
}

// out (+)= decoded codes of n <= kSignMagTile elements from `packed_tile` (8 readable spare bytes).
inline void dequantize_tile(const std::uint8_t* packed_tile, std::size_t n, float unit, unsigned bits, float* out,
                            bool accumulate, bool stream) {
  std::size_t i = 0;
#if defined(__AVX2__)
  const int b = static_cast<int>(bits);
  const __m256i shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b);
  const __m256i mask = _mm256_set1_epi32((1 << b) - 1);
  const __m256i level_mask = _mm256_set1_epi32((1 << (b - 1)) - 1);
  const __m256 v_unit = _mm256_set1_ps(unit);
  for (; unit >= 0.0f && i + 8 <= n; i += 8) {  // a tiny scale's negated unit: the scalar loop
    std::uint64_t word;
    std::memcpy(&word, packed_tile + i / 8 * bits, sizeof(word));
    const __m256i code = unpack8_avx2(word, shifts, mask, bits);
    const __m256 magnitude = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(code, level_mask)), v_unit);
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(code, b - 1), 31);
    __m256 value = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
    if (accumulate) value = _mm256_add_ps(_mm256_loadu_ps(out + i), value);
    store8(out + i, value, stream);
  }
#else
  (void)stream;
#endif
  std::uint8_t codes[8];
  for (; i < n; i += 8) {
    unpack8(packed_tile + i / 8 * bits, bits, codes);
    const std::size_t m = std::min<std::size_t>(8, n - i);
    for (std::size_t j = 0; j < m; ++j) {
      const float value = signmag_dequantize(codes[j], unit, bits);
      out[i + j] = accumulate ? out[i + j] + value : value;
    }
  }
}

}  // namespace detail

// Quantizes v = g[i] + r[i] (r may be null: no error feedback) for i in [begin, end) with one `scale`, writes the
// codes into `packed` (the whole tensor's packed section; begin must be a multiple of 8, and end too unless it is
// the tensor's end) and the residual v - decoded into r_out (= r for the in-place update; another buffer for the
// fused path's ping-pong, which then leaves r untouched). `stream_out`: non-temporal stores into r_out (see
// use_stream_stores; the caller fences with stream_fence before its chunk ends). One quantizer per stream and width
// (it holds the broadcast Philox round keys); `quantize` is const and may be called from several threads.
class SignMagQuantizer {
 public:
  SignMagQuantizer(unsigned bits, const PhiloxStream& stream)
      : bits_(bits),
        stream_(stream)
#if defined(__AVX2__)
        ,
        philox_(stream)
#endif
  {
  }

  void quantize(const float* g, const float* r, float* r_out, std::size_t begin, std::size_t end, float scale,
                std::uint8_t* packed, bool stream_out = false) const {
    const std::uint32_t levels = signmag_levels(bits_);
    const float unit = signmag_unit(scale, levels);
    const float inverse = signmag_inverse_unit(scale, levels);
    std::size_t i = begin;
#if defined(__AVX2__)
    if ((bits_ == 2 || bits_ == 4) && end - begin >= 64 && inverse >= 0.0f) {
      const StoreKind kind = r ? store_kind(r_out + begin, stream_out) : StoreKind::kPlain;
      i = detail::with_store_kind(kind, [&](auto k) {
        constexpr StoreKind kKind = decltype(k)::value;
        if (bits_ == 4) {
          return r ? detail::quantize_fast<4, true, kKind>(g, r, r_out, i, end, inverse, unit, philox_, packed)
                   : detail::quantize_fast<4, false, kKind>(g, r, r_out, i, end, inverse, unit, philox_, packed);
        }
        return r ? detail::quantize_fast<2, true, kKind>(g, r, r_out, i, end, inverse, unit, philox_, packed)
                 : detail::quantize_fast<2, false, kKind>(g, r, r_out, i, end, inverse, unit, philox_, packed);
      });
    }
#endif
    if (i < end) quantize_tiles(g, r, r_out, i, end, inverse, unit, levels, packed, stream_out);
  }

 private:
  // The 8-wide tile loop (any width, any tail): Philox draws for a tile, codes into a staging tile, then copied.
  void quantize_tiles(const float* g, const float* r, float* r_out, std::size_t begin, std::size_t end, float inverse,
                      float unit, std::uint32_t levels, std::uint8_t* packed, bool stream_out) const {
    alignas(64) std::uint32_t random[kSignMagTile / 2 + 4];
    alignas(64) std::uint8_t tile[kSignMagTile + 16];
    for (std::size_t t0 = begin; t0 < end; t0 += kSignMagTile) {
      const std::size_t n = std::min(kSignMagTile, end - t0);
      philox_fill(stream_, t0 / 2, (n + 1) / 2, random);  // t0 is a multiple of 8: t0 / 2 of 4
      detail::quantize_tile(g + t0, r ? r + t0 : nullptr, r ? r_out + t0 : nullptr, n, random, inverse, unit, levels,
                            bits_, tile, stream_out);
      std::memcpy(packed + t0 / 8 * bits_, tile, packed_bytes(n, bits_));
    }
  }

  unsigned bits_;
  PhiloxStream stream_;
#if defined(__AVX2__)
  PhiloxAvx2 philox_;
#endif
};

// One-off form of SignMagQuantizer::quantize (builds the quantizer for this call).
inline void signmag_quantize_range(const float* g, const float* r, float* r_out, std::size_t begin, std::size_t end,
                                   float scale, unsigned bits, const PhiloxStream& stream, std::uint8_t* packed,
                                   bool stream_out = false) {
  SignMagQuantizer(bits, stream).quantize(g, r, r_out, begin, end, scale, packed, stream_out);
}

// A bucket whose v holds NaN/Inf (nonfinite=pass): every code is 0 (the caller stores a NaN scale, so the bucket
// decodes to NaN and the framework's overflow check sees it), and the residual keeps the finite part of v, since
// nothing usable was sent. The new residual goes to r_out (= r in place).
inline void signmag_nonfinite_range(const float* g, const float* r, float* r_out, std::size_t begin, std::size_t end,
                                    unsigned bits, std::uint8_t* packed) {
  if (r) {
    for (std::size_t i = begin; i < end; ++i) {
      const float v = g[i] + r[i];
      r_out[i] = std::isfinite(v) ? v : 0.0f;
    }
  }
  std::memset(packed + begin / 8 * bits, 0, packed_bytes(end - begin, bits));
}

// Decodes codes [begin, end) (begin a multiple of 8) of one bucket with wire `scale` into out (= or +=); `stream`:
// non-temporal stores (see use_stream_stores; the caller fences).
inline void signmag_decode_range(const std::uint8_t* packed, std::size_t begin, std::size_t end, float scale,
                                 unsigned bits, float* out, bool accumulate, bool stream = false) {
  const float unit = signmag_unit(scale, signmag_levels(bits));
  std::size_t i = begin;
#if defined(__AVX2__)
  if (bits == 2 || bits == 4) {
    i = detail::with_store_kind(store_kind(out + begin, stream && !accumulate), [&](auto k) {
      constexpr StoreKind kKind = decltype(k)::value;
      if (bits == 4) {
        return accumulate ? detail::decode_fast_bits4<true, kKind>(packed, i, end, unit, out)
                          : detail::decode_fast_bits4<false, kKind>(packed, i, end, unit, out);
      }
      return accumulate ? detail::decode_fast_bits2<true, kKind>(packed, i, end, unit, out)
                        : detail::decode_fast_bits2<false, kKind>(packed, i, end, unit, out);
    });
  }
#endif
  alignas(64) std::uint8_t tile[kSignMagTile + 16];
  for (std::size_t t0 = i; t0 < end; t0 += kSignMagTile) {
    const std::size_t n = std::min(kSignMagTile, end - t0);
    const std::size_t bytes = packed_bytes(n, bits);
    std::memcpy(tile, packed + t0 / 8 * bits, bytes);
    std::memset(tile + bytes, 0, 16);
    detail::dequantize_tile(tile, n, unit, bits, out + t0, accumulate, stream);
  }
}

}  // namespace gradcomp::kernels
