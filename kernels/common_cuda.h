// Small CUDA kernels the compressor framework needs around every codec: dtype conversion of f16/bf16 tensors,
// non-finite counting and resetting, and the grid size for grid-stride loops. CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda_counters.cuh"

namespace gradcomp::kernels {

// Blocks for a grid-stride kernel of `threads` threads over `work_items` items: enough to fill every SM a few times,
// no more (a persistent-style grid). At least 1. Prefer the overload that names the kernel.
unsigned grid_for(std::size_t work_items, unsigned threads);
// The same for `kernel` (a __global__ function): at most as many blocks as can be resident at once
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor x SMs, asked once per kernel, block size and device), so a
// grid-stride kernel whose registers allow, say, 6 blocks per SM is not launched with 8 and a second, 1/3-full wave.
unsigned grid_for(std::size_t work_items, unsigned threads, const void* kernel);
template <typename... Args>
unsigned grid_for(std::size_t work_items, unsigned threads, void (*kernel)(Args...)) {
  return grid_for(work_items, threads, reinterpret_cast<const void*>(kernel));
}

// f16 (is_bf16 = false) or bf16 bits -> f32, n elements.
void launch_half_to_float(const std::uint16_t* in, float* out, std::size_t n, bool is_bf16, cudaStream_t stream);
// f32 -> f16/bf16 bits, round to nearest even (kernels/half_ops.cuh), n elements.
void launch_float_to_half(const float* in, std::uint16_t* out, std::size_t n, bool is_bf16, cudaStream_t stream);
// Adds the number of NaN/Inf values among n into counters->nonfinite.
void launch_count_nonfinite(const float* values, std::size_t n, DeviceCounters* counters, cudaStream_t stream);
// Sets every NaN/Inf among n values to zero.
void launch_zero_nonfinite(float* values, std::size_t n, cudaStream_t stream);

// Largest block launch_write_bytes takes.
inline constexpr std::size_t kMaxWriteBytes = 128;
// Writes bytes[0, count) (host memory, count <= kMaxWriteBytes) to device memory `out`, in stream order. The bytes
// are passed by value as a kernel argument, so `bytes` may be a stack buffer that goes away when this returns (no
// pageable-memory copy, no pinned buffer to keep alive). For headers and other small host-made records. Throws
// CudaError (invalid value) when count > kMaxWriteBytes.
void launch_write_bytes(void* out, const void* bytes, std::size_t count, cudaStream_t stream);

// Writes the metadata block (kernels/payload_meta.cuh) of the payload at `payload` (device memory, `size` bytes) into
// `out` (`capacity` bytes: device memory, or page-locked host memory the device writes directly), in stream order,
// with one block of threads. The host reads it after a synchronization: one wait for every part's header.
void launch_collect_payload_meta(const void* payload, std::size_t size, void* out, std::size_t capacity,
                                 cudaStream_t stream);

}  // namespace gradcomp::kernels
