// The 64-value AVX2 fast paths of the sign-magnitude quantizer (compressors/codecs/signmag_cpu.h): 2- and 4-bit codes, their
// level lookup table, 64-code packing and the 8/16-value decoders; compiled only with AVX2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/bitpack_ops.cuh"
#include "kernels/philox_cpu.h"
#include "kernels/qsgd_ops.cuh"
#include "kernels/stream_store.h"

#if defined(__AVX2__)
#include <immintrin.h>

namespace gradcomp::kernels::detail {

// The decoded magnitudes of levels 0..7 (signmag_dequantize of the positive codes), lane k = level k: the lookup
// table of the 2- and 4-bit fast paths (levels above the code's maximum are never looked up).
inline __m256 level_table(float unit, unsigned bits) {
  alignas(32) float table[8];
  const std::uint32_t levels = signmag_levels(bits);
  for (std::uint32_t k = 0; k < 8; ++k) table[k] = signmag_dequantize(k <= levels ? k : 0u, unit, bits);
  return _mm256_load_ps(table);
}

// Packs 64 4-bit codes, c[j] lane l = code 8j + l, into 32 bytes (code i in the nibble i % 2 of byte i / 2).
inline void pack64_bits4(const __m256i (&c)[8], std::uint8_t* out) {
  // Bytes per 128-bit lane after two packs: lane 0 = codes 8j + 0..3 of j = 0..3, lane 1 = codes 8j + 4..7.
  const __m256i q0 = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  const __m256i q1 = _mm256_packus_epi16(_mm256_packus_epi32(c[4], c[5]), _mm256_packus_epi32(c[6], c[7]));
  const __m256i nibbles = _mm256_set1_epi16(0x1001);  // byte pairs (a, b) -> a + 16 b
  const __m256i m0 = _mm256_maddubs_epi16(q0, nibbles), m1 = _mm256_maddubs_epi16(q1, nibbles);
  // Byte k of the output = codes 2k, 2k+1. Lane 0 of the pack holds output bytes (0,1)(4,5)...(28,29), lane 1 the
  // pairs (2,3)(6,7)...(30,31): gather quarters 0, 2 | 1, 3, then interleave the 16-bit pairs.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(m0, m1), 0xD8);
  const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,  //
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_shuffle_epi8(packed, order));
}

// Packs 64 2-bit codes, c[j] lane l = code 8j + l, into 16 bytes (code i in bits 2 (i % 4) of byte i / 4).
inline void pack64_bits2(const __m256i (&c)[8], std::uint8_t* out) {
  const __m256i q0 = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  const __m256i q1 = _mm256_packus_epi16(_mm256_packus_epi32(c[4], c[5]), _mm256_packus_epi32(c[6], c[7]));
  // 4 consecutive code bytes (a, b, c, d) -> a + 4 b + 16 c + 64 d in a 32-bit lane: output byte 2j (lane 0) or
  // 2j + 1 (lane 1) for the group of c[j] (j = 0..3 from q0, 4..7 from q1).
  const __m256i pairs = _mm256_set1_epi16(0x0401), quads = _mm256_set1_epi32(0x00100001);
  const __m256i x0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0, pairs), quads);
  const __m256i x1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, pairs), quads);
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(x0, x1), _mm256_setzero_si256());
  // Lane 0 holds the even output bytes 0, 2, ..., 14, lane 1 the odd ones.
  const __m128i even = _mm256_castsi256_si128(bytes), odd = _mm256_extracti128_si256(bytes, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi8(even, odd));
}

// Software prefetch distance of the quantizer's input streams (g and r), in elements: 4 KB per stream, two
// 512-value buckets ahead, issued from the compute-heavy quantize loop so that the next buckets' first pass (their
// statistics) finds them in cache (measured: docs/compressors.md).
inline constexpr std::size_t kSignMagPrefetch = 1024;

// Prefetches the cache line of x[i + kSignMagPrefetch] (never faults, also past the end of x).
inline void prefetch_ahead(const float* x, std::size_t i) {
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(x) + (i + kSignMagPrefetch) * sizeof(float);
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

// Codes of v = g + r (kResidual: r and r_out valid) for the 64 values g[0..64) with uniforms u[0..64) (32-byte
// aligned), packed into 8 * kBits bytes at out; the new residual v - decoded goes to r_out with stores of kKind.
template <unsigned kBits, bool kResidual, StoreKind kKind>
inline void quantize64(const float* g, const float* r, float* r_out, const float* u, __m256 inverse, __m256 levels_f,
                       __m256 table, std::uint8_t* out) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256i codes[8];
  for (int j = 0; j < 8; ++j) {
    __m256 v = _mm256_loadu_ps(g + 8 * j);
    if constexpr (kResidual) v = _mm256_add_ps(v, _mm256_loadu_ps(r + 8 * j));
    const __m256 sign = _mm256_and_ps(v, sign_mask);
    const __m256 x = _mm256_min_ps(_mm256_mul_ps(_mm256_xor_ps(v, sign), inverse), levels_f);
    // x <= levels and u <= 1 - 2^-16, and levels + 1 - 2^-16 is a float for bits <= 8, so x + u rounds to less than
    // levels + 1: signmag_quantize's clamp of the level to `levels` never changes it here.
    const __m256i level = _mm256_cvttps_epi32(_mm256_add_ps(x, _mm256_load_ps(u + 8 * j)));
    codes[j] = _mm256_or_si256(level, _mm256_srli_epi32(_mm256_castps_si256(sign), 32 - kBits));
    if constexpr (kResidual) {
      const __m256 decoded = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, level), sign);
      store8_as<kKind>(r_out + 8 * j, _mm256_sub_ps(v, decoded));
    }
  }
  if constexpr (kBits == 4) {
    pack64_bits4(codes, out);
  } else {
    pack64_bits2(codes, out);
  }
}

// The fast path over [i, end) in steps of 64 (i a multiple of 8); returns where it stopped.
template <unsigned kBits, bool kResidual, StoreKind kKind>
inline std::size_t quantize_fast(const float* g, const float* r, float* r_out, std::size_t i, std::size_t end,
                                 float inverse, float unit, const PhiloxAvx2& philox, std::uint8_t* packed) {
  const __m256 v_inverse = _mm256_set1_ps(inverse);
  const __m256 v_levels = _mm256_set1_ps(static_cast<float>(signmag_levels(kBits)));
  const __m256 table = level_table(unit, kBits);
  alignas(32) float u[64];
  for (; i + 64 <= end; i += 64) {
    for (std::size_t line = 0; line < 64; line += 16) {
      prefetch_ahead(g, i + line);
      if constexpr (kResidual) prefetch_ahead(r, i + line);
    }
    philox.uniforms64(i / 8, u);
    quantize64<kBits, kResidual, kKind>(g + i, kResidual ? r + i : nullptr, kResidual ? r_out + i : nullptr, u,
                                        v_inverse, v_levels, table, packed + i / 8 * kBits);
  }
  return i;
}

// out (+)= decoded 4-bit codes [i, end) in steps of 8 (i a multiple of 8); returns where it stopped.
template <bool kAccumulate, StoreKind kKind>
inline std::size_t decode_fast_bits4(const std::uint8_t* packed, std::size_t i, std::size_t end, float unit,
                                     float* out) {
  const __m256 table = level_table(unit, 4);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  for (; i + 8 <= end; i += 8) {
    std::uint32_t word;
    std::memcpy(&word, packed + i / 2, sizeof(word));
    const __m256i code = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts);
    // The table reads the low 3 bits (the level); bit 3 (the sign) moves to bit 31.
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(code, 28), sign_mask);
    __m256 value = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, code), _mm256_castsi256_ps(sign));
    if constexpr (kAccumulate) value = _mm256_add_ps(_mm256_loadu_ps(out + i), value);
    store8_as<kKind>(out + i, value);
  }
  return i;
}

// out (+)= decoded 2-bit codes [i, end) in steps of 16 (i a multiple of 8); returns where it stopped.
template <bool kAccumulate, StoreKind kKind>
inline std::size_t decode_fast_bits2(const std::uint8_t* packed, std::size_t i, std::size_t end, float unit,
                                     float* out) {
  // Indexed by the code's 2 bits (level, sign) plus one bit of the next code, which the period-4 table ignores.
  alignas(32) float entries[8];
  for (std::uint32_t k = 0; k < 8; ++k) entries[k] = signmag_dequantize(k & 3u, unit, 2);
  const __m256 table = _mm256_load_ps(entries);
  const __m256i shifts_lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i shifts_hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  for (; i + 16 <= end; i += 16) {
    std::uint32_t word;
    std::memcpy(&word, packed + i / 4, sizeof(word));
    const __m256i all = _mm256_set1_epi32(static_cast<int>(word));
    __m256 lo = _mm256_permutevar8x32_ps(table, _mm256_srlv_epi32(all, shifts_lo));
    __m256 hi = _mm256_permutevar8x32_ps(table, _mm256_srlv_epi32(all, shifts_hi));
    if constexpr (kAccumulate) {
      lo = _mm256_add_ps(_mm256_loadu_ps(out + i), lo);
      hi = _mm256_add_ps(_mm256_loadu_ps(out + i + 8), hi);
    }
    store8_as<kKind>(out + i, lo);
    store8_as<kKind>(out + i + 8, hi);
  }
  return i;
}

// Calls fn(std::integral_constant<StoreKind, kind>{}) for the runtime `kind`.
template <typename Fn>
inline decltype(auto) with_store_kind(StoreKind kind, Fn&& fn) {
  switch (kind) {
    case StoreKind::kStream32:
      return fn(std::integral_constant<StoreKind, StoreKind::kStream32>{});
    case StoreKind::kStream16:
      return fn(std::integral_constant<StoreKind, StoreKind::kStream16>{});
    default:
      return fn(std::integral_constant<StoreKind, StoreKind::kPlain>{});
  }
}

}  // namespace gradcomp::kernels::detail
#endif
