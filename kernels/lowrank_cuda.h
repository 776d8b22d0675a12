// Launchers of the CUDA kernels behind compressors/lowrank_ops_cuda.cc (the CUDA LowRankOps of PowerSGD): element
// loops that give the host loops' bits (compressors/lowrank_ops_cpu.cc), Gram-Schmidt over a few long rows, and the
// NaN/Inf search. Every launcher enqueues on `stream`, allocates nothing and checks cudaPeekAtLastError after each
// launch; none synchronizes. CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradcomp::kernels {

// Element type of a tensor that store_f32 writes (the values of gradcomp::DType for f32, f16 and bf16).
enum class LowRankDType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// y[i] = y[i] + x[i], n elements.
void launch_lowrank_add(float* y, const float* x, std::size_t n, cudaStream_t stream);
// x[i] = x[i] * s, n elements (also for s == 1: callers that want the host's "s == 1 is a no-op" skip the call).
void launch_lowrank_scale(float* x, std::size_t n, float s, cudaStream_t stream);
// out[i] (=, or += when accumulate) s * values[i], rounded to `dtype` (round to nearest even, kernels/half_ops.cuh);
// `out` points at element 0 of the range (n elements of dtype). Accumulation rounds once: the old value read as
// float, plus s * values[i] (itself rounded to float), rounded to dtype.
void launch_lowrank_store(const float* values, float s, void* out, LowRankDType dtype, std::size_t n, bool accumulate,
                          cudaStream_t stream);
// x[i] = uniform01(stream.bits(i)) - 0.5f of PhiloxStream::make(seed, key, step) (kernels/philox_ops.cuh).
void launch_lowrank_fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step,
                                cudaStream_t stream);
// C (m x n, row-major, leading dimension ldc) = (beta == 0 ? 0 : beta * C): the k == 0 case of a matrix product.
void launch_lowrank_scale_matrix(float* c, std::size_t m, std::size_t n, std::size_t ldc, float beta,
                                 cudaStream_t stream);

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
