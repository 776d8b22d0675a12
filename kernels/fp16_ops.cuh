// fp16 / bf16 wire conversions with gradcomp's overflow policy, identical on host and device.
//
// fp16: finite values beyond the half range saturate to +-65504 (never a silent inf); the caller counts them. Inf and
// NaN (only reachable under nonfinite=pass) keep their class; every NaN becomes the one wire NaN of
// kernels/wire_nan.cuh (0x7E00 / 0x7FC0), so CPU and GPU payloads agree. Rounding is to nearest even.
// bf16: round to nearest even (bf16 has the f32 range, so nothing saturates except values that round past the largest
// bf16, which also saturate to +-max and are counted).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/half_ops.cuh"
#include "kernels/host_device.cuh"
#include "kernels/wire_nan.cuh"

namespace gradcomp::kernels {

// True when `value` is finite but rounds beyond the largest finite half.
GRADCOMP_HOST_DEVICE bool fp16_saturates(float value) {
  const std::uint32_t abs_bits = float_bits(value) & 0x7FFFFFFFu;
  return abs_bits >= 0x477FF000u && abs_bits < 0x7F800000u;
}

// float -> half bits, saturating finite overflow to +-65504; any NaN -> 0x7E00.
GRADCOMP_HOST_DEVICE std::uint16_t fp16_encode(float value) {
  if (is_nan_bits(value)) return kWireNanF16;
  if (fp16_saturates(value)) return static_cast<std::uint16_t>(((float_bits(value) >> 16) & 0x8000u) | 0x7BFFu);
  return float_to_half_bits(value);
}

GRADCOMP_HOST_DEVICE float fp16_decode(std::uint16_t bits) { return half_bits_to_float(bits); }

// Largest finite bfloat16 (0x7F7F).
inline constexpr float kBf16Max = 3.38953139e38f;

// True when `value` is finite but rounds (to nearest even) to bf16 infinity.
GRADCOMP_HOST_DEVICE bool bf16_saturates(float value) {
  const std::uint32_t abs_bits = float_bits(value) & 0x7FFFFFFFu;
  return abs_bits >= 0x7F7F8000u && abs_bits < 0x7F800000u;
}

// float -> bf16 bits, round to nearest even, saturating finite overflow to +-max; any NaN -> 0x7FC0.
GRADCOMP_HOST_DEVICE std::uint16_t bf16_encode(float value) {
  if (is_nan_bits(value)) return kWireNanBF16;
  if (bf16_saturates(value)) return static_cast<std::uint16_t>(((float_bits(value) >> 16) & 0x8000u) | 0x7F7Fu);
  return float_to_bf16_bits(value);
}

GRADCOMP_HOST_DEVICE float bf16_decode(std::uint16_t bits) { return bf16_bits_to_float(bits); }

}  // namespace gradcomp::kernels
