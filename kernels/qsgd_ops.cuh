// QSGD / TernGrad per-element math (Alistarh et al. 2017; Wen et al. 2017), identical on host and device.
//
// A bucket with scale S > 0 and L levels has the unit S / L. A value v becomes the code (sign(v), level) with
//   x = min(|v| * (L / S), L),  level = min(floor(x + u), L),  u ~ U[0, 1) from Philox (signmag_uniform),
// so level is floor(x) or floor(x) + 1 with P(up) = x - floor(x): E[level * unit] = min(|v|, S), unbiased whenever
// |v| <= S (always for QSGD's max and l2 scales; TernGrad's clipped scale makes it unbiased for clip(v, -S, S)).
// The decoded value is (sign ? -1 : 1) * (float(level) * unit). The encoder's residual uses the same expression.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/bitpack_ops.cuh"
#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

// Levels of a `bits`-wide sign-magnitude code: 2^(bits-1) - 1 (bits=2: 1 = ternary, bits=4: 7, bits=8: 127).
GRADCOMP_HOST_DEVICE std::uint32_t signmag_levels(unsigned bits) { return (1u << (bits - 1u)) - 1u; }

// Unit (value of level 1) of a bucket with `scale` and `levels`.
GRADCOMP_HOST_DEVICE float signmag_unit(float scale, std::uint32_t levels) {
  return scale / static_cast<float>(levels);
}

// Multiplier from |v| to the level domain; 0 for an all-zero bucket (every level becomes 0).
// Clamped to the largest finite float, so |v| * inverse is never 0 * inf (a tiny subnormal scale).
GRADCOMP_HOST_DEVICE float signmag_inverse_unit(float scale, std::uint32_t levels) {
  const float inverse = scale > 0.0f ? static_cast<float>(levels) / scale : 0.0f;
  return inverse < 3.40282347e38f ? inverse : 3.40282347e38f;
}

// The uniform in [0, 1) of element `index` of a tensor: 16 bits of the Philox stream, so one 32-bit draw
// (PhiloxStream::bits(index / 2)) serves two elements, the low half the even one. 16 bits make the probability of
// rounding up exact to 2^-16 (a bias below 2^-16 of one level step), and halve the Philox work.
GRADCOMP_HOST_DEVICE float signmag_uniform(std::uint32_t draw, std::uint64_t index) {
  return static_cast<float>((draw >> (16u * (index & 1u))) & 0xFFFFu) * (1.0f / 65536.0f);
}

// Stochastic rounding of one value to a code; `uniform` in [0, 1).
GRADCOMP_HOST_DEVICE std::uint32_t signmag_quantize(float value, float inverse_unit, std::uint32_t levels,
                                                    unsigned bits, float uniform) {
  const float x = fminf(fabsf(value) * inverse_unit, static_cast<float>(levels));
  std::uint32_t level = static_cast<std::uint32_t>(static_cast<std::int32_t>(x + uniform));  // x + u < 2^8
  level = level < levels ? level : levels;
  return (sign_bit(value) << (bits - 1u)) | level;
}

// The value a code stands for.
GRADCOMP_HOST_DEVICE float signmag_dequantize(std::uint32_t code, float unit, unsigned bits) {
  const float magnitude = static_cast<float>(code & ((1u << (bits - 1u)) - 1u)) * unit;
  return (code >> (bits - 1u)) ? -magnitude : magnitude;
}

// TernGrad's bucket scale: max|v|, clipped to clip * sigma when clip > 0 (sigma: standard deviation of the bucket).
GRADCOMP_HOST_DEVICE float terngrad_scale(float max_abs, float sigma, float clip) {
  if (clip > 0.0f) {
    const float bound = clip * sigma;
    return bound < max_abs ? bound : max_abs;
  }
  return max_abs;
}

}  // namespace gradcomp::kernels
