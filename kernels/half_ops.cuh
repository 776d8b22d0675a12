// IEEE binary16 and bfloat16 conversions by bit manipulation, round-to-nearest-even, identical on host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

GRADCOMP_HOST_DEVICE std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

GRADCOMP_HOST_DEVICE float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Largest finite binary16 value.
inline constexpr float kHalfMax = 65504.0f;

// float -> binary16 bits, round to nearest even; overflow gives +-inf, NaN stays NaN (quiet).
GRADCOMP_HOST_DEVICE std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits >= 0x7F800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs_bits > 0x7F800000u ? 0x0200u : 0u));
  }
  if (abs_bits >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (abs_bits < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs_bits < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to zero
    const std::uint32_t exponent = abs_bits >> 23;
    const std::uint32_t mantissa = (abs_bits & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14 .. 24
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = ((abs_bits - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const std::uint32_t remainder = abs_bits & 0x1FFFu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

GRADCOMP_HOST_DEVICE float half_bits_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  const std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_float(sign);
  // subnormal: value = mantissa * 2^-24
  const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
  return sign ? -magnitude : magnitude;
}

// float -> bfloat16 bits, round to nearest even; NaN stays NaN.
GRADCOMP_HOST_DEVICE std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

GRADCOMP_HOST_DEVICE float bf16_bits_to_float(std::uint16_t bf16) {
  return bits_float(static_cast<std::uint32_t>(bf16) << 16);
}

}  // namespace gradcomp::kernels
