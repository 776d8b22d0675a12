// Launchers of the CUDA kernels behind compressors/cuda/lowrank_ops_cuda.cc (the CUDA LowRankOps of PowerSGD): element
// loops over kernels/lowrank_ops.cuh's functions, which the host loops (compressors/codecs/lowrank_ops_cpu.cc) call too, so
// both give the same bits; the k == 1 matrix product (an outer product, likewise); Gram-Schmidt over a few long rows;
// and the NaN/Inf search. Every launcher enqueues on `stream`, allocates nothing and checks cudaPeekAtLastError
// after each launch; none synchronizes. CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/lowrank_ops.cuh"

namespace gradcomp::kernels {

// y[i] = y[i] + x[i], n elements.
void launch_lowrank_add(float* y, const float* x, std::size_t n, cudaStream_t stream);
// x[i] = x[i] * s, n elements (also for s == 1: callers that want the host's "s == 1 is a no-op" skip the call).
void launch_lowrank_scale(float* x, std::size_t n, float s, cudaStream_t stream);
// out[i] (=, or += when accumulate) s * values[i], rounded to `dtype` (kernels::lowrank_store); `out` points at
// element 0 of the range (n elements of dtype).
void launch_lowrank_store(const float* values, float s, void* out, LowRankDType dtype, std::size_t n, bool accumulate,
                          cudaStream_t stream);
// x[i] = lowrank_random(stream.bits(i)) of PhiloxStream::make(seed, key, step) (kernels/philox_ops.cuh).
void launch_lowrank_fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step,
                                cudaStream_t stream);
// C (m x n, row-major, leading dimension ldc) = (beta == 0 ? 0 : beta * C): the k == 0 case of a matrix product.
void launch_lowrank_scale_matrix(float* c, std::size_t m, std::size_t n, std::size_t ldc, float beta,
                                 cudaStream_t stream);
// C (m x n, row-major, leading dimension ldc) = alpha x y^T + beta C, the k == 1 case of a matrix product: x_i =
// x[i * x_stride], y_j = y[j * y_stride], each element kernels::lowrank_outer (beta 0 does not read C).
void launch_lowrank_outer(float* c, std::size_t m, std::size_t n, std::size_t ldc, float alpha, const float* x,
                         std::size_t x_stride, const float* y, std::size_t y_stride, float beta, cudaStream_t stream);

// Device bytes launch_find_nonfinite writes: result[0] = the count of NaN/Inf, result[1] = the smallest index of one
// (ULLONG_MAX when none).
inline constexpr std::size_t kNonfiniteResultBytes = 2 * sizeof(unsigned long long);
// Counts the NaN/Inf among x[0, n) and finds the first, into `result` (device, 2 values, see above). It initializes
// `result` itself, in stream order.
void launch_find_nonfinite(const float* x, std::size_t n, unsigned long long* result, cudaStream_t stream);

// Bytes of device workspace launch_orthonormalize_rows needs (fixed: it does not depend on the sizes). 256-byte
// aligned memory (cudaMalloc's); its contents need no initialization.
std::size_t orthonormalize_workspace_bytes();
// Gram-Schmidt over the `rows` rows of v (row-major, each `cols` long): row j loses its projections on rows 0..j-1,
// then is divided by (its norm + eps), or set to zero when norm + eps == 0. The projections are removed twice
// (classical Gram-Schmidt with one reorthogonalization, "twice is enough"), 64 earlier rows per pass, so a row costs
// four launches (rows <= 65) however many rows precede it; dot products and norms are summed in double in a fixed
// order (the same bits on every run on one device). In exact arithmetic this is the host's modified Gram-Schmidt;
// in float it agrees with it within rounding for well-conditioned rows and keeps rows at least as orthogonal when
// they are nearly dependent. `workspace` holds orthonormalize_workspace_bytes(); calls sharing one workspace must be
// ordered (one stream).
void launch_orthonormalize_rows(float* v, std::size_t rows, std::size_t cols, float eps, void* workspace,
                                cudaStream_t stream);

}  // namespace gradcomp::kernels
