// Device helpers shared by the CUDA kernels: warp sums and one-atomic-per-warp counter updates.
#pragma once

#if defined(__CUDACC__)
#include "kernels/cuda_counters.cuh"

namespace gradcomp::kernels {

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(0xFFFFFFFFu, value, offset);
  return value;
}

// Adds a per-thread count to *target with one atomic per warp, only when the warp's total is non-zero. Every thread of
// the warp must call it (full-warp shuffle). The atomics add integers, so the result is order-independent.
__device__ __forceinline__ void warp_count(unsigned long long value, unsigned long long* target) {
  value = warp_sum(value);
  if ((threadIdx.x & 31u) == 0 && value != 0) atomicAdd(target, value);
}

}  // namespace gradcomp::kernels
#endif
