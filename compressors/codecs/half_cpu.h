// CPU loops of the fp16/bf16 codecs: fused v = g + r, prescale, round (saturating), residual update r' = v - sent,
// where sent = decode(wire) / prescale is in the unscaled domain. Per-element math: kernels/fp16_ops.cuh. With F16C
// and AVX2 the fp16 loop uses the hardware conversion (round to nearest even, like fp16_encode; vectors holding a NaN
// fall back to the scalar function so NaN bits match too); a test checks it against fp16_encode bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/fp16_ops.cuh"
#include "kernels/stream_store.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define GRADCOMP_HAVE_F16C 1
#else
#define GRADCOMP_HAVE_F16C 0
#endif

namespace gradcomp::kernels {

enum class HalfFormat { kF16, kBF16 };

template <HalfFormat kFormat>
GRADCOMP_HOST_DEVICE std::uint16_t half_encode(float value) {
  if constexpr (kFormat == HalfFormat::kF16) return fp16_encode(value);
  return bf16_encode(value);
}
template <HalfFormat kFormat>
GRADCOMP_HOST_DEVICE float half_decode(std::uint16_t bits) {
  if constexpr (kFormat == HalfFormat::kF16) return fp16_decode(bits);
  return bf16_decode(bits);
}
template <HalfFormat kFormat>
GRADCOMP_HOST_DEVICE bool half_saturates(float value) {
  if constexpr (kFormat == HalfFormat::kF16) return fp16_saturates(value);
  return bf16_saturates(value);
}

// Scalar reference loop over [0, n); returns the number of saturated values. r may be null (no error feedback); the
// new residual goes to r_out (= r in place; non-null whenever r is).
template <HalfFormat kFormat>
std::size_t half_encode_scalar(const float* g, const float* r, float* r_out, std::size_t n, float prescale,
                               std::uint16_t* out) {
  std::size_t saturated = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = r ? g[i] + r[i] : g[i];
    const float x = v * prescale;
    saturated += half_saturates<kFormat>(x);
    const std::uint16_t h = half_encode<kFormat>(x);
    out[i] = h;
    if (r) r_out[i] = v - half_decode<kFormat>(h) / prescale;
  }
  return saturated;
}

#if GRADCOMP_HAVE_F16C
// 8 values at a time with F16C; identical results to half_encode_scalar<kF16>. `stream`: non-temporal stores into
// r_out (16-byte aligned; the caller fences).
inline std::size_t fp16_encode_avx2(const float* g, const float* r, float* r_out, std::size_t n, float prescale,
                                    std::uint16_t* out, bool stream) {
  const __m256 scale = _mm256_set1_ps(prescale);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 sat_from = _mm256_set1_ps(65520.0f);
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  const __m256 half_max = _mm256_set1_ps(kHalfMax);
  std::size_t saturated = 0;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(g + i);
    if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
    const __m256 x = _mm256_mul_ps(v, scale);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) {  // a NaN: the scalar path defines its bits
      saturated += half_encode_scalar<HalfFormat::kF16>(g + i, r ? r + i : nullptr, r ? r_out + i : nullptr, 8,
                                                        prescale, out + i);
      continue;
    }
    const __m256 a = _mm256_and_ps(x, abs_mask);
    const __m256 sat = _mm256_and_ps(_mm256_cmp_ps(a, sat_from, _CMP_GE_OQ), _mm256_cmp_ps(a, inf, _CMP_LT_OQ));
    const __m256 clamped = _mm256_or_ps(_mm256_andnot_ps(abs_mask, x), half_max);  // +-65504 with x's sign
    const __m256 y = _mm256_blendv_ps(x, clamped, sat);
    saturated += static_cast<std::size_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(sat))));
    const __m128i h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    if (r) store8(r_out + i, _mm256_sub_ps(v, _mm256_div_ps(_mm256_cvtph_ps(h), scale)), stream);
  }
  saturated += half_encode_scalar<HalfFormat::kF16>(g + i, r ? r + i : nullptr, r ? r_out + i : nullptr, n - i,
                                                    prescale, out + i);
  return saturated;
}
#endif

// The fastest available encode loop for kFormat; the new residual goes to r_out (= r in place; non-null whenever r
// is). `stream`: non-temporal stores into r_out where the loop is vectorized (16-byte aligned; the caller fences).
template <HalfFormat kFormat>
std::size_t half_encode_range(const float* g, const float* r, float* r_out, std::size_t n, float prescale,
                              std::uint16_t* out, bool stream = false) {
#if GRADCOMP_HAVE_F16C
  if constexpr (kFormat == HalfFormat::kF16) return fp16_encode_avx2(g, r, r_out, n, prescale, out, stream);
#endif
  (void)stream;
  return half_encode_scalar<kFormat>(g, r, r_out, n, prescale, out);
}

// In-place residual update.
template <HalfFormat kFormat>
std::size_t half_encode_range(const float* g, float* r, std::size_t n, float prescale, std::uint16_t* out) {
  return half_encode_range<kFormat>(g, r, r, n, prescale, out, false);
}

// Whether some of the n encoded values is Inf or NaN (exponent all ones). Encoding saturates finite values, so this
// flags exactly the non-finite inputs of the encode (a superset of the non-finite gradient values).
template <HalfFormat kFormat>
bool half_any_nonfinite(const std::uint16_t* h, std::size_t n) {
  constexpr std::uint16_t kExponent = kFormat == HalfFormat::kF16 ? 0x7C00 : 0x7F80;
  unsigned bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad |= (h[i] & kExponent) == kExponent;
  return bad != 0;
}

// out[i] (+)= decode(in[i]) for i in [0, n); `stream`: non-temporal stores (see use_stream_stores; caller fences).
template <HalfFormat kFormat>
void half_decode_range(const std::uint16_t* in, std::size_t n, float* out, bool accumulate, bool stream = false) {
  std::size_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256 x;
    if constexpr (kFormat == HalfFormat::kF16) {
#if GRADCOMP_HAVE_F16C
      x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
#else
      break;
#endif
    } else {  // bf16: the 16 bits become the top half of an f32
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (accumulate) x = _mm256_add_ps(x, _mm256_loadu_ps(out + i));
    store8(out + i, x, stream);
  }
#else
  (void)stream;
#endif
  if (accumulate) {
    for (; i < n; ++i) out[i] += half_decode<kFormat>(in[i]);
  } else {
    for (; i < n; ++i) out[i] = half_decode<kFormat>(in[i]);
  }
}

}  // namespace gradcomp::kernels
