#include "kernels/collective_cuda.h"

#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

__global__ void divide_count_kernel(float* values, std::size_t n, float divisor, bool divide,
                                    unsigned long long* nonzero) {
  unsigned long long count = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float v = values[i];
    if (divide && v != 0.0f) {  // zeros divide to themselves: no write, as on the host
      v = __fdiv_rn(v, divisor);
      values[i] = v;
    }
    count += v != 0.0f;  // true for NaN too
  }
  if (nonzero == nullptr) return;
  __shared__ unsigned long long block_count;
  if (threadIdx.x == 0) block_count = 0;
  __syncthreads();
  // One shared-memory atomic per thread, one global atomic per block.
  if (count) atomicAdd(&block_count, count);
  __syncthreads();
  if (threadIdx.x == 0 && block_count) atomicAdd(nonzero, block_count);
}

__global__ void add_kernel(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    acc[i] = __fadd_rn(acc[i], x[i]);
  }
}

}  // namespace

void launch_add(float* acc, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(acc, x, n);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_divide_count(float* values, std::size_t n, float divisor, unsigned long long* nonzero,
                         cudaStream_t stream) {
  if (n == 0) return;
  const bool divide = divisor != 1.0f;
  if (!divide && nonzero == nullptr) return;
  divide_count_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(values, n, divisor, divide, nonzero);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
