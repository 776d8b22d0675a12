// Kernels of the compressed collectives' device path (comm/algorithms/memory_space_cuda.cc). CUDA builds only.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace gradcomp::kernels {

// values[i] /= divisor for i < n (skipped when divisor is 1); when `nonzero` is not null, adds the count of nonzero
// results (NaN counts as nonzero, as on the host) to *nonzero, which the caller zeroes first.
void launch_divide_count(float* values, std::size_t n, float divisor, unsigned long long* nonzero,
                         cudaStream_t stream);

// acc[i] += x[i] for i < n (round to nearest, no contraction: the host's bits).
void launch_add(float* acc, const float* x, std::size_t n, cudaStream_t stream);

}  // namespace gradcomp::kernels
