// Per-element math of the dense codecs (none = 0, fp16 = 1, bf16 = 2), shared by CPU loops and CUDA kernels.
// With error feedback:  v = g + r;  s = v * prescale;  wire = round(s);  r' = v - decode(wire) / prescale.
// NOTE(cuda): the fp16/bf16 CPU codecs are written on the `quantizers` branch; when they land, this must be the
// function they call (or call theirs), so that the CUDA payloads stay bit-identical to the CPU ones.
#pragma once

#include <cstdint>

#include "kernels/half_ops.cuh"
#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

template <typename Wire>
struct DenseEncoded {
  Wire wire;
  float residual;
  unsigned saturated;
};

template <int Kind>
GRADCOMP_HOST_DEVICE auto dense_encode_element(float g, float r, bool ef, float prescale, bool saturate) {
  const float v = ef ? g + r : g;
  float s = v * prescale;
  if constexpr (Kind == 0) {
    return DenseEncoded<float>{s, ef ? v - s / prescale : 0.0f, 0u};
  } else {
    unsigned saturated = 0;
    if (Kind == 1 && saturate && (s > kHalfMax || s < -kHalfMax)) {  // NaN compares false: passes through
      s = s > 0.0f ? kHalfMax : -kHalfMax;
      saturated = 1;
    }
    const std::uint16_t w = Kind == 1 ? float_to_half_bits(s) : float_to_bf16_bits(s);
    const float sent = Kind == 1 ? half_bits_to_float(w) : bf16_bits_to_float(w);
    return DenseEncoded<std::uint16_t>{w, ef ? v - sent / prescale : 0.0f, saturated};
  }
}

template <int Kind, typename Wire>
GRADCOMP_HOST_DEVICE float dense_decode_element(Wire w) {
  if constexpr (Kind == 0) {
    return w;
  } else if constexpr (Kind == 1) {
    return half_bits_to_float(w);
  } else {
    return bf16_bits_to_float(w);
  }
}

}  // namespace gradcomp::kernels
