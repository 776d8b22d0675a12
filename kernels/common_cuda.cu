#include "kernels/common_cuda.h"

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda_check.h"
#include "kernels/cuda_reduce.cuh"
#include "kernels/half_ops.cuh"
#include "kernels/payload_meta.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

__global__ void half_to_float_kernel(const std::uint16_t* in, float* out, std::size_t n, bool is_bf16) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = is_bf16 ? bf16_bits_to_float(in[i]) : half_bits_to_float(in[i]);
  }
}

__global__ void float_to_half_kernel(const float* in, std::uint16_t* out, std::size_t n, bool is_bf16) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = is_bf16 ? float_to_bf16_bits(in[i]) : float_to_half_bits(in[i]);
  }
}

// Loop bounds are uniform per warp round (the whole warp iterates while any lane has work), so warp_count's
// full-warp shuffle is legal.
__global__ void count_nonfinite_kernel(const float* values, std::size_t n, DeviceCounters* counters) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  unsigned long long count = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    count += !isfinite(values[i]);
  }
  warp_count(count, &counters->nonfinite);
}

__global__ void zero_nonfinite_kernel(float* values, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (!isfinite(values[i])) values[i] = 0.0f;
  }
}

struct SmallBlock {
  unsigned char bytes[kMaxWriteBytes];
};

__global__ void write_bytes_kernel(unsigned char* out, SmallBlock block, unsigned count) {
  if (threadIdx.x < count) out[threadIdx.x] = block.bytes[threadIdx.x];
}

}  // namespace

namespace {

unsigned capped_grid(std::size_t work_items, unsigned threads, int sms, int blocks_per_sm) {
  const std::size_t wanted = (work_items + threads - 1) / threads;
  const std::size_t cap = static_cast<std::size_t>(sms > 0 ? sms : 1) * static_cast<std::size_t>(blocks_per_sm);
  const std::size_t blocks = wanted < cap ? wanted : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

// Resident blocks per SM of (kernel, block size) on `device`, asked once: the answer is fixed for a loaded module.
int resident_blocks(const void* kernel, unsigned threads, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, unsigned, int>, int> known;
  const auto key = std::make_tuple(kernel, threads, device);
  {
    const std::lock_guard lock(mutex);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  int blocks = 0;
  GRADCOMP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, static_cast<int>(threads), 0));
  blocks = blocks > 0 ? blocks : 1;
  const std::lock_guard lock(mutex);
  known.emplace(key, blocks);
  return blocks;
}

}  // namespace

unsigned grid_for(std::size_t work_items, unsigned threads) {
  int device = 0, sms = 0;
  GRADCOMP_CUDA_CHECK(cudaGetDevice(&device));
  GRADCOMP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return capped_grid(work_items, threads, sms, 8);
}

unsigned grid_for(std::size_t work_items, unsigned threads, const void* kernel) {
  int device = 0, sms = 0;
  GRADCOMP_CUDA_CHECK(cudaGetDevice(&device));
  GRADCOMP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return capped_grid(work_items, threads, sms, resident_blocks(kernel, threads, device));
}

void launch_half_to_float(const std::uint16_t* in, float* out, std::size_t n, bool is_bf16, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, half_to_float_kernel);
  half_to_float_kernel<<<grid, kThreads, 0, stream>>>(in, out, n, is_bf16);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_float_to_half(const float* in, std::uint16_t* out, std::size_t n, bool is_bf16, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, float_to_half_kernel);
  float_to_half_kernel<<<grid, kThreads, 0, stream>>>(in, out, n, is_bf16);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_count_nonfinite(const float* values, std::size_t n, DeviceCounters* counters, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, count_nonfinite_kernel);
  count_nonfinite_kernel<<<grid, kThreads, 0, stream>>>(values, n, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_zero_nonfinite(float* values, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, zero_nonfinite_kernel);
  zero_nonfinite_kernel<<<grid, kThreads, 0, stream>>>(values, n);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_write_bytes(void* out, const void* bytes, std::size_t count, cudaStream_t stream) {
  // (gradcomp/error.h's fmt does not compile under nvcc: report an oversized block as CUDA's invalid value.)
  GRADCOMP_CUDA_CHECK(count <= kMaxWriteBytes ? cudaSuccess : cudaErrorInvalidValue);
  if (count == 0) return;
  SmallBlock block{};
  std::memcpy(block.bytes, bytes, count);
  write_bytes_kernel<<<1, kMaxWriteBytes, 0, stream>>>(static_cast<unsigned char*>(out), block,
                                                       static_cast<unsigned>(count));
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

namespace {

// One block: thread 0 lays out the parts, then every thread copies (kernels/payload_meta.cuh).
__global__ void collect_payload_meta_kernel(const unsigned char* payload, std::size_t size, unsigned char* out,
                                            std::size_t capacity) {
  __shared__ std::uint64_t offsets[kMaxMetaParts];
  __shared__ std::size_t parts;
  if (threadIdx.x == 0) {
    parts = meta_parts(payload, size, capacity);
    meta_part_offsets(payload, parts, offsets);
  }
  __syncthreads();
  meta_copy_block(payload, size, out, parts, offsets, threadIdx.x, blockDim.x);
}

}  // namespace

void launch_collect_payload_meta(const void* payload, std::size_t size, void* out, std::size_t capacity,
                                 cudaStream_t stream) {
  collect_payload_meta_kernel<<<1, kThreads, 0, stream>>>(static_cast<const unsigned char*>(payload), size,
                                                          static_cast<unsigned char*>(out), capacity);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
