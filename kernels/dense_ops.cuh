// Per-element math of the dense codecs on the CUDA path (none = 0, fp16 = 1, bf16 = 2). The fp16/bf16 rounding and
// saturation are kernels/fp16_ops.cuh's (the functions the CPU loops in compressors/codecs/half_cpu.h call), composed exactly
// as
// half_encode_scalar does:  v = g + r;  x = v * prescale;  wire = encode(x);  r' = v - decode(wire) / prescale.
// NaN on the wire is kernels/wire_nan.cuh's one pattern (the GPU's own arithmetic NaN is 0x7FFFFFFF).
#pragma once

#include <cstdint>

#include "kernels/fp16_ops.cuh"
#include "kernels/host_device.cuh"
#include "kernels/wire_nan.cuh"

namespace gradcomp::kernels {

template <typename Wire>
struct DenseEncoded {
  Wire wire;
  float residual;
  unsigned saturated;
};

template <int Kind>
GRADCOMP_HOST_DEVICE auto dense_encode_element(float g, float r, bool ef, float prescale) {
  const float v = ef ? g + r : g;
  const float s = v * prescale;
  if constexpr (Kind == 0) {
    return DenseEncoded<float>{wire_f32(s), ef ? v - s / prescale : 0.0f, 0u};  // one NaN on the wire
  } else {
    const unsigned saturated = Kind == 1 ? fp16_saturates(s) : bf16_saturates(s);
    const std::uint16_t w = Kind == 1 ? fp16_encode(s) : bf16_encode(s);
    const float sent = Kind == 1 ? fp16_decode(w) : bf16_decode(w);
    return DenseEncoded<std::uint16_t>{w, ef ? v - sent / prescale : 0.0f, saturated};
  }
}

template <int Kind, typename Wire>
GRADCOMP_HOST_DEVICE float dense_decode_element(Wire w) {
  if constexpr (Kind == 0) {
    return w;
  } else if constexpr (Kind == 1) {
    return fp16_decode(w);
  } else {
    return bf16_decode(w);
  }
}

}  // namespace gradcomp::kernels
