// One NaN on the wire. Under nonfinite=pass a payload may carry NaN, and CPU and GPU must write the same bytes for
// it; but the NaN an arithmetic operation returns differs by machine: x86 keeps the input NaN's sign and payload
// (quieted), NVIDIA GPUs return 0x7FFFFFFF. So every codec writes NaN through these functions: an f32 NaN on the
// wire is always 0x7FC00000, an f16 NaN 0x7E00 and a bf16 NaN 0x7FC0 (positive, quiet, empty payload), whatever NaN
// the arithmetic produced. Finite values and infinities pass through unchanged. Decoded outputs are not rewritten:
// a NaN a decoder copies keeps the wire's bits, one an accumulation produces is the machine's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half_ops.cuh"
#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

inline constexpr std::uint32_t kWireNanF32 = 0x7FC00000u;
inline constexpr std::uint16_t kWireNanF16 = 0x7E00u;
inline constexpr std::uint16_t kWireNanBF16 = 0x7FC0u;

// True for every NaN bit pattern (exponent all ones, mantissa non-zero), by bits: immune to -ffast-math.
GRADCOMP_HOST_DEVICE bool is_nan_bits(float value) { return (float_bits(value) & 0x7FFFFFFFu) > 0x7F800000u; }

// `value`, or the wire NaN (0x7FC00000) when it is any NaN. For f32 values written to a payload.
GRADCOMP_HOST_DEVICE float wire_f32(float value) { return is_nan_bits(value) ? bits_float(kWireNanF32) : value; }

// Rewrites every NaN among values[0, n) to the wire NaN (for a payload body written by memcpy).
inline void canonicalize_nans(float* values, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) values[i] = wire_f32(values[i]);
}

}  // namespace gradcomp::kernels
