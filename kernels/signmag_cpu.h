// CPU loops of the sign-magnitude bucket quantizer behind QSGD and TernGrad: fused compensate (v = g + r), stochastic
// rounding, bit packing and residual update (r' = v - decoded), one bucket at a time so the second pass over a
// bucket hits L1. Per-element math: kernels/qsgd_ops.cuh.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/bitpack_ops.cuh"
#include "kernels/philox_cpu.h"
#include "kernels/qsgd_ops.cuh"

namespace gradcomp::kernels {

// Quantizes v = g[i] + r[i] (r may be null: no error feedback) for i in [begin, end) with one scale, writes codes
// into `packed` (the whole tensor's packed section; begin must be a multiple of 8) and the residual v - decoded
// into r. `unscaled_scale` gives the residual's unit; the wire scale is stored separately by the caller.
inline void signmag_quantize_range(const float* g, float* r, std::size_t begin, std::size_t end, float scale,
                                   unsigned bits, const PhiloxStream& stream, std::uint8_t* packed) {
  constexpr std::size_t kTile = 256;
  const std::uint32_t levels = signmag_levels(bits);
  const float unit = signmag_unit(scale, levels);
  const float inverse = signmag_inverse_unit(scale, levels);
  alignas(64) std::uint32_t random[kTile];
  alignas(64) std::uint8_t codes[kTile];
  for (std::size_t t0 = begin; t0 < end; t0 += kTile) {
    const std::size_t n = std::min(kTile, end - t0);
    philox_fill(stream, t0, n, random);
    if (r) {
      for (std::size_t i = 0; i < n; ++i) {
        const float v = g[t0 + i] + r[t0 + i];
        const std::uint32_t code = signmag_quantize(v, inverse, levels, bits, uniform01(random[i]));
        codes[i] = static_cast<std::uint8_t>(code);
        r[t0 + i] = v - signmag_dequantize(code, unit, bits);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        codes[i] = static_cast<std::uint8_t>(signmag_quantize(g[t0 + i], inverse, levels, bits, uniform01(random[i])));
      }
    }
    const std::size_t groups = n / 8;
    std::uint8_t* dst = packed + t0 / 8 * bits;
    for (std::size_t k = 0; k < groups; ++k) pack8(codes + 8 * k, bits, dst + k * bits);
    if (const std::size_t rest = n % 8) {  // only at the end of the tensor
      std::uint8_t last[8] = {};
      std::memcpy(last, codes + 8 * groups, rest);
      std::uint8_t bytes[16] = {};  // pack8 writes `bits` <= 8 bytes; 16 keeps -Wstringop-overflow quiet
      pack8(last, bits, bytes);
      std::memcpy(dst + groups * bits, bytes, packed_bytes(rest, bits));
    }
  }
}

// A bucket whose v holds NaN/Inf (nonfinite=pass): every code is 0 (the caller stores a NaN scale, so the bucket
// decodes to NaN and the framework's overflow check sees it), and the residual keeps the finite part of v, since
// nothing usable was sent.
inline void signmag_nonfinite_range(const float* g, float* r, std::size_t begin, std::size_t end, unsigned bits,
                                    std::uint8_t* packed) {
  if (r) {
    for (std::size_t i = begin; i < end; ++i) {
      const float v = g[i] + r[i];
      r[i] = std::isfinite(v) ? v : 0.0f;
    }
  }
  std::memset(packed + begin / 8 * bits, 0, packed_bytes(end - begin, bits));
}

// Decodes codes [begin, end) (begin a multiple of 8) of one bucket with wire `scale` into out (= or +=).
inline void signmag_decode_range(const std::uint8_t* packed, std::size_t begin, std::size_t end, float scale,
                                 unsigned bits, float* out, bool accumulate) {
  constexpr std::size_t kTile = 256;
  const float unit = signmag_unit(scale, signmag_levels(bits));
  alignas(64) std::uint8_t codes[kTile];
  for (std::size_t t0 = begin; t0 < end; t0 += kTile) {
    const std::size_t n = std::min(kTile, end - t0);
    const std::uint8_t* src = packed + t0 / 8 * bits;
    const std::size_t groups = n / 8;
    for (std::size_t k = 0; k < groups; ++k) unpack8(src + k * bits, bits, codes + 8 * k);
    if (const std::size_t rest = n % 8) {
      std::uint8_t bytes[16] = {};
      std::memcpy(bytes, src + groups * bits, packed_bytes(rest, bits));
      unpack8(bytes, bits, codes + 8 * groups);
    }
    float* dst = out + t0;
    if (accumulate) {
      for (std::size_t i = 0; i < n; ++i) dst[i] += signmag_dequantize(codes[i], unit, bits);
    } else {
      for (std::size_t i = 0; i < n; ++i) dst[i] = signmag_dequantize(codes[i], unit, bits);
    }
  }
}

}  // namespace gradcomp::kernels
