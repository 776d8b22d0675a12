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

// The two 16-bit wire formats: the first f32 magnitude (bits) that rounds past the largest finite value, that value's
// bits, the one wire NaN, and the rounding (to nearest even).
struct Fp16Wire {
  static constexpr std::uint32_t kOverflowBits = 0x477FF000u;
  static constexpr std::uint16_t kMaxBits = 0x7BFFu;
  static constexpr std::uint16_t kNanBits = kWireNanF16;
  GRADCOMP_HOST_DEVICE static std::uint16_t round(float value) { return float_to_half_bits(value); }
};
struct Bf16Wire {
  static constexpr std::uint32_t kOverflowBits = 0x7F7F8000u;
  static constexpr std::uint16_t kMaxBits = 0x7F7Fu;
  static constexpr std::uint16_t kNanBits = kWireNanBF16;
  GRADCOMP_HOST_DEVICE static std::uint16_t round(float value) { return float_to_bf16_bits(value); }
};

// True when `value` is finite but rounds beyond Wire's largest finite value.
template <class Wire>
GRADCOMP_HOST_DEVICE bool wire_saturates(float value) {
  const std::uint32_t abs_bits = float_bits(value) & 0x7FFFFFFFu;
  return abs_bits >= Wire::kOverflowBits && abs_bits < 0x7F800000u;
}

// float -> Wire bits: any NaN -> the wire NaN, finite overflow -> +-max, else rounded to nearest even.
template <class Wire>
GRADCOMP_HOST_DEVICE std::uint16_t wire_encode(float value) {
  if (is_nan_bits(value)) return Wire::kNanBits;
  if (wire_saturates<Wire>(value)) {
    return static_cast<std::uint16_t>(((float_bits(value) >> 16) & 0x8000u) | Wire::kMaxBits);
  }
  return Wire::round(value);
}

// fp16: saturating finite overflow to +-65504; any NaN -> 0x7E00.
GRADCOMP_HOST_DEVICE bool fp16_saturates(float value) { return wire_saturates<Fp16Wire>(value); }
GRADCOMP_HOST_DEVICE std::uint16_t fp16_encode(float value) { return wire_encode<Fp16Wire>(value); }
GRADCOMP_HOST_DEVICE float fp16_decode(std::uint16_t bits) { return half_bits_to_float(bits); }

// Largest finite bfloat16 (0x7F7F).
inline constexpr float kBf16Max = 3.38953139e38f;

// bf16: saturating finite overflow (values that round to infinity) to +-max; any NaN -> 0x7FC0.
GRADCOMP_HOST_DEVICE bool bf16_saturates(float value) { return wire_saturates<Bf16Wire>(value); }
GRADCOMP_HOST_DEVICE std::uint16_t bf16_encode(float value) { return wire_encode<Bf16Wire>(value); }
GRADCOMP_HOST_DEVICE float bf16_decode(std::uint16_t bits) { return bf16_bits_to_float(bits); }

}  // namespace gradcomp::kernels
