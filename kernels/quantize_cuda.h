// Launchers of the bucketed sign-magnitude codecs' CUDA kernels: QSGD (max or l2 scale), TernGrad, 1-bit. One warp
// per bucket: a statistics pass that reproduces kernels/bucket_reduce.h's summation order exactly (8 interleaved
// lanes, combined ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))), then a fused compensate + stochastic round (16-bit Philox
// uniforms, signmag_uniform: one block per 8 elements) + pack + residual update pass. Output is the CPU codecs' payload sections, byte for byte.
// CUDA builds only; launched on `stream`; no allocation (the workspace is sized by a null-pointer query).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda_counters.cuh"
#include "kernels/philox_ops.cuh"

namespace gradcomp::kernels {

enum class QuantKind : std::uint8_t { kQsgdMax = 0, kQsgdL2 = 1, kTernGrad = 2, kOneBit = 3 };

struct QuantizeParams {
  QuantKind kind = QuantKind::kQsgdMax;
  unsigned bits = 4;        // code width (TernGrad 2, 1-bit 1)
  std::size_t bucket = 512; // values per scale, a multiple of 8; 0 (TernGrad only) = one scale for the whole tensor
  float clip = 0.0f;        // TernGrad: clip at clip * sigma (0 = off)
  float prescale = 1.0f;    // wire scale = scale * prescale
  PhiloxStream stream{};    // random stream of (seed, tensor, step); unused by 1-bit
};

// Encodes v = grad (+ residual) into `scales` (one f32 per bucket, unaligned allowed) and `packed` (bits per value),
// writes the new residual to residual_out when residual is non-null, counts non-finite gradient values into
// counters->nonfinite, and ORs `nonfinite_flag` into *header_flags (device) when some bucket held NaN/Inf.
// Two-phase: with workspace == null only sets workspace_bytes.
void launch_quantize_encode(const QuantizeParams& params, const float* grad, const float* residual,
                            float* residual_out, std::byte* scales, std::uint8_t* packed, std::size_t n,
                            DeviceCounters* counters, std::uint16_t* header_flags, std::uint16_t nonfinite_flag,
                            void* workspace, std::size_t& workspace_bytes, cudaStream_t stream);

// Sets *error_flag to 1 when some scale is negative or non-finite (NaN allowed when allow_nan).
void launch_check_scales(const std::byte* scales, std::size_t count, bool allow_nan, int* error_flag,
                         cudaStream_t stream);

// out[i] (+)= decoded value of code i with its bucket's scale. `bucket` is the effective bucket (n for one scale).
void launch_quantize_decode(unsigned bits, bool onebit, std::size_t bucket, const std::byte* scales,
                            const std::uint8_t* packed, float* out, std::size_t n, bool accumulate,
                            cudaStream_t stream);

}  // namespace gradcomp::kernels
