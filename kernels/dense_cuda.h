// Launchers of the dense codecs' CUDA kernels (none, fp16, bf16): one fused pass per element,
//   v = grad + residual;  wire = encode(v * prescale);  residual' = v - decode(wire) / prescale   (error feedback)
// with 16-byte vector loads when every pointer is 16-byte aligned. Launched on `stream`; never allocate; check
// cudaPeekAtLastError after each launch. CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda_counters.cuh"

namespace gradcomp::kernels {

enum class DenseWire : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

struct DenseEncodeParams {
  DenseWire wire = DenseWire::kF32;
  float prescale = 1.0f;
};

// Encodes n values of `grad` (+ `residual` when non-null) into `out` (n wire elements). When residual is non-null,
// residual_out receives the new residual (it may equal residual). Counts non-finite inputs and values that saturated
// to the wire type's largest finite value (kernels/fp16_ops.cuh) into `counters` (device).
void launch_dense_encode(const DenseEncodeParams& params, const float* grad, const float* residual,
                         float* residual_out, void* out, std::size_t n, DeviceCounters* counters, cudaStream_t stream);

// out[i] = (accumulate ? out[i] : 0) + decode(body[i]) for n wire elements.
void launch_dense_decode(DenseWire wire, const void* body, float* out, std::size_t n, bool accumulate,
                         cudaStream_t stream);

}  // namespace gradcomp::kernels
