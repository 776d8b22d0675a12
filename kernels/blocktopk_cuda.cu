// The block top-k (blocktopk) device kernels declared in kernels/sparse_cuda.h: block norms with the error-feedback
// accumulation, and the gather and scatter of whole blocks. Selection of the top blocks reuses the sparse top-k
// threshold and compaction (kernels/sparse_cuda.cu) over the block keys.
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_reduce.cuh"
#include "kernels/sparse_cuda.h"
#include "kernels/sparsify_ops.cuh"
#include "kernels/wire_nan.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

// One warp per tensor block: the lanes load 32 consecutive elements at a time (coalesced; the first device profile
// measured a thread per block, striding `block` floats apart, at 12% of DRAM bandwidth) and write v = r + g; every
// lane then sums the squares of the 32 shuffled values in index order (block_norm_step: the CPU's order and bits).
__global__ void block_norms_kernel(const float* grad, const float* residual, float* values, std::size_t n,
                                   std::size_t block, std::uint32_t* keys, DeviceCounters* counters) {
  constexpr unsigned kAllLanes = 0xFFFFFFFFu;
  const unsigned lane = threadIdx.x & 31u;
  const std::size_t blocks = (n + block - 1) / block;
  const std::size_t warps = std::size_t{gridDim.x} * blockDim.x / 32;
  unsigned long long nonfinite = 0;
  for (std::size_t b = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32; b < blocks; b += warps) {
    const std::size_t begin = b * block, end = begin + block < n ? begin + block : n;
    float sum = 0.0f;
    for (std::size_t base = begin; base < end; base += 32) {
      const std::size_t i = base + lane;
      float v = 0.0f;
      if (i < end) {
        const float g = grad[i];
        nonfinite += !isfinite(g);
        v = g;
        if (residual) {
          v = ef_accumulate(residual[i], g);
          values[i] = v;
        }
      }
      const unsigned count = end - base < 32 ? static_cast<unsigned>(end - base) : 32u;  // the same on every lane
      for (unsigned j = 0; j < count; ++j) sum = block_norm_step(sum, __shfl_sync(kAllLanes, v, j));
    }
    if (lane == 0) keys[b] = magnitude_key(sum);
  }
  warp_count(nonfinite, &counters->nonfinite);
}

// One thread per element of the selected blocks (count * block slots; slots past the tensor's end do nothing).
__global__ void block_gather_kernel(const float* values, const std::int32_t* ids, std::size_t count, std::size_t block,
                                    std::size_t n, float prescale, float* body, float* residual_out) {
  for (std::size_t t = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; t < count * block;
       t += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t j = t / block, e = t % block;
    const std::size_t i = static_cast<std::size_t>(ids[j]) * block + e;
    if (i >= n) continue;
    const float v = values[i];
    const float wire = v * prescale;
    body[t] = wire_f32(wire);
    if (residual_out) residual_out[i] = prescale == 1.0f ? v - wire : v - wire / prescale;
  }
}

// Race-free without atomics: block ids are validated strictly increasing, so the blocks are disjoint.
__global__ void block_scatter_kernel(const std::int32_t* ids, std::size_t count, std::size_t block, std::size_t n,
                                     const float* body, float* out, bool accumulate) {
  for (std::size_t t = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; t < count * block;
       t += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t j = t / block, e = t % block;
    const std::size_t i = static_cast<std::size_t>(ids[j]) * block + e;
    if (i >= n) continue;
    out[i] = accumulate ? out[i] + body[t] : body[t];
  }
}

}  // namespace

void launch_block_norms(const float* grad, const float* residual, float* values, std::size_t n, std::size_t block,
                        std::uint32_t* keys, DeviceCounters* counters, cudaStream_t stream) {
  if (n == 0) return;
  const std::size_t blocks = (n + block - 1) / block;
  const unsigned grid = grid_for(blocks * 32, kThreads, block_norms_kernel);  // a warp per block
  block_norms_kernel<<<grid, kThreads, 0, stream>>>(grad, residual, values, n, block, keys, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_block_gather(const float* values, const std::int32_t* ids, std::size_t count, std::size_t block,
                         std::size_t n, float prescale, float* body, float* residual_out, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned grid = grid_for(count * block, kThreads, block_gather_kernel);
  block_gather_kernel<<<grid, kThreads, 0, stream>>>(values, ids, count, block, n, prescale, body, residual_out);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_block_scatter(const std::int32_t* ids, std::size_t count, std::size_t block, std::size_t n,
                          const float* body, float* out, bool accumulate, cudaStream_t stream) {
  if (!accumulate && n > 0) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out, 0, n * sizeof(float), stream));
  if (count == 0) return;
  const unsigned grid = grid_for(count * block, kThreads, block_scatter_kernel);
  block_scatter_kernel<<<grid, kThreads, 0, stream>>>(ids, count, block, n, body, out, accumulate);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
