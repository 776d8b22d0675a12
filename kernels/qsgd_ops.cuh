// QSGD / TernGrad per-element math (Alistarh et al. 2017; Wen et al. 2017), identical on host and device.
//
// A bucket with scale S > 0 and L levels has the unit S / L. A value v becomes the code (sign(v), level) with
//   x = min(|v| * (L / S), L),  level = min(floor(x + u), L),  u ~ U[0, 1) from Philox (signmag_uniform),
// so level is floor(x) or floor(x) + 1 with P(up) = x - floor(x): E[level * unit] = min(|v|, S), unbiased whenever
// |v| <= S (always for QSGD's max and l2 scales; TernGrad's clipped scale makes it unbiased for clip(v, -S, S)).
// The decoded value is (sign ? -1 : 1) * (float(level) * unit). The encoder's residual uses the same expression.
//
// Tiny scales (0 < S < 2^-100): L / S can overflow f32 and S / L is subnormal (few significant bits, or 0), which
// decoded such buckets to a fraction of their value or to zero. They are computed on values multiplied by 2^100
// (exact: a power of two, and |v| * 2^100 stays finite for |v| <= S): signmag_unit / signmag_inverse_unit then return
// the *negated* unit and inverse of the rescaled bucket, and signmag_quantize / signmag_dequantize, seeing the sign,
// rescale the value (x = |v| * 2^100 * inverse) and the decoded magnitude (level * unit * 2^-100). Loops that use
// the unit or inverse directly (the CPU's AVX2 paths) take the scalar functions for such buckets.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/bitpack_ops.cuh"
#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

// Levels of a `bits`-wide sign-magnitude code: 2^(bits-1) - 1 (bits=2: 1 = ternary, bits=4: 7, bits=8: 127).
GRADCOMP_HOST_DEVICE std::uint32_t signmag_levels(unsigned bits) { return (1u << (bits - 1u)) - 1u; }

// True for a scale that takes the rescaled path (see above).
GRADCOMP_HOST_DEVICE bool signmag_tiny_scale(float scale) { return scale > 0.0f && scale < 0x1p-100f; }

// Unit (value of level 1) of a bucket with `scale` and `levels`; for a tiny scale, minus the unit of the bucket
// rescaled by 2^100.
GRADCOMP_HOST_DEVICE float signmag_unit(float scale, std::uint32_t levels) {
  if (signmag_tiny_scale(scale)) return -((scale * 0x1p100f) / static_cast<float>(levels));
  return scale / static_cast<float>(levels);
}

// Multiplier from |v| to the level domain; 0 for an all-zero bucket (every level becomes 0); for a tiny scale, minus
// the multiplier from |v| * 2^100.
GRADCOMP_HOST_DEVICE float signmag_inverse_unit(float scale, std::uint32_t levels) {
  if (signmag_tiny_scale(scale)) return -(static_cast<float>(levels) / (scale * 0x1p100f));
  return scale > 0.0f ? static_cast<float>(levels) / scale : 0.0f;
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
  const float magnitude = fabsf(value);
  const float scaled = inverse_unit < 0.0f ? (magnitude * 0x1p100f) * -inverse_unit : magnitude * inverse_unit;
  const float x = fminf(scaled, static_cast<float>(levels));
  std::uint32_t level = static_cast<std::uint32_t>(static_cast<std::int32_t>(x + uniform));  // x + u < 2^8
  level = level < levels ? level : levels;
  return (sign_bit(value) << (bits - 1u)) | level;
}

// The value a code stands for.
GRADCOMP_HOST_DEVICE float signmag_dequantize(std::uint32_t code, float unit, unsigned bits) {
  const float level = static_cast<float>(code & ((1u << (bits - 1u)) - 1u));
  const float magnitude = unit < 0.0f ? (level * -unit) * 0x1p-100f : level * unit;
  return (code >> (bits - 1u)) ? -magnitude : magnitude;
}

// TernGrad's bucket scale: max|v|, clipped to clip * sigma when clip > 0 (sigma: standard deviation of the bucket).
// A sigma below 2^-63 is not trusted (its square is below FLT_MIN: the f32 sum of squares it came from was subnormal
// or 0), so such a tiny bucket is not clipped: clipping it to ~0 would transmit nothing.
GRADCOMP_HOST_DEVICE float terngrad_scale(float max_abs, float sigma, float clip) {
  if (clip > 0.0f && sigma >= 0x1p-63f) {
    const float bound = clip * sigma;
    return bound < max_abs ? bound : max_abs;
  }
  return max_abs;
}

}  // namespace gradcomp::kernels
