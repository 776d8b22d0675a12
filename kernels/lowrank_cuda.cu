#include "kernels/lowrank_cuda.h"

#include <algorithm>
#include <cstddef>

#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/lowrank_ops.cuh"
#include "kernels/philox_ops.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / 32;

// ---- element loops (the host loops of compressors/codecs/lowrank_ops_cpu.cc: the same kernels/lowrank_ops.cuh functions) --

__global__ void __launch_bounds__(kThreads) add_kernel(float* y, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    y[i] = y[i] + x[i];
  }
}

__global__ void __launch_bounds__(kThreads) scale_kernel(float* x, std::size_t n, float s) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] = x[i] * s;
  }
}

template <LowRankDType D>
__global__ void __launch_bounds__(kThreads)
    store_kernel(const float* values, float s, void* out, std::size_t n, bool accumulate) {
  auto* dst = static_cast<LowRankElement<D>*>(out);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    lowrank_store<D>(dst[i], values[i], s, accumulate);
  }
}

// One Philox block (four draws) per thread and iteration: elements 4q .. 4q+3.
__global__ void __launch_bounds__(kThreads) fill_random_kernel(float* x, std::size_t n, PhiloxStream stream) {
  const std::size_t groups = (n + 3) / 4;
  for (std::size_t q = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; q < groups;
       q += std::size_t{gridDim.x} * blockDim.x) {
    const Philox4 draw = stream.block(q);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::size_t i = 4 * q + static_cast<std::size_t>(j);
      if (i < n) x[i] = lowrank_random(draw.v[j]);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    scale_matrix_kernel(float* c, std::size_t m, std::size_t n, std::size_t ldc, float beta) {
  const std::size_t total = m * n;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    float& value = c[(e / n) * ldc + e % n];
    value = beta == 0.0f ? 0.0f : beta * value;
  }
}

// Row i of the outer product in blocks along y (rows strided by gridDim.y), its columns over x.
__global__ void __launch_bounds__(kThreads)
    outer_kernel(float* c, std::size_t m, std::size_t n, std::size_t ldc, float alpha, const float* x,
                 std::size_t x_stride, const float* y, std::size_t y_stride, float beta) {
  for (std::size_t i = blockIdx.y; i < m; i += gridDim.y) {
    const float xi = lowrank_outer_row(alpha, x[i * x_stride]);
    float* row = c + i * ldc;
    for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < n;
         j += std::size_t{gridDim.x} * blockDim.x) {
      row[j] = beta == 0.0f ? lowrank_outer(xi, y[j * y_stride]) : lowrank_outer(xi, y[j * y_stride], beta, row[j]);
    }
  }
}

// result[0] += NaN/Inf count, result[1] = min(result[1], first NaN/Inf index). A grid-stride loop visits a thread's
// indices in increasing order, so its first hit is its smallest; every thread reaches the full-warp shuffles.
__global__ void __launch_bounds__(kThreads)
    find_nonfinite_kernel(const float* x, std::size_t n, unsigned long long* result) {
  unsigned long long count = 0, first = ~0ull;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (lowrank_nonfinite(x[i])) {
      if (count == 0) first = i;
      ++count;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    count += __shfl_down_sync(0xFFFFFFFFu, count, offset);
    first = min(first, __shfl_down_sync(0xFFFFFFFFu, first, offset));
  }
  if ((threadIdx.x & 31u) == 0 && count != 0) {
    atomicAdd(&result[0], count);
    atomicMin(&result[1], first);
  }
}

// ---- Gram-Schmidt ----------------------------------------------------------------------------------------------------
//
// A "project" kernel makes one pass over row j (and over `count` earlier rows, the chunk): optionally
//   update:  x = row[c] - sum_i coef[i] * prior_i[c]   (i in order, each product rounded, as the host loop does)
//   dots:    the chunk's dot products with the (updated) row,
//   squares: the (updated) row's sum of squares,
// each in double: per thread, then per block (warp shuffles, then the block's warps in order) into a partial per
// block; the block that arrives last sums the partials in block order and writes the results (dots as float; the
// divisor float(sqrt(squares)) + eps). Fixed order throughout: the same bits on every run with the same grid.

constexpr int kChunk = 64;            // earlier rows per pass
constexpr unsigned kMaxBlocks = 1024;  // grid cap of the project kernels (partials per value)

struct OrthoWork {
  double partial[kChunk + 1][kMaxBlocks];  // [value][block]; value kMax of a kernel = sum of squares
  float coef[2][kChunk];                   // dot products: written by one pass, read by the next
  float divisor;                           // norm + eps of the row being finished
  unsigned arrivals;                       // blocks done with the current kernel; the last one resets it to 0
};

struct ProjectArgs {
  const float* prior = nullptr;  // first row of the chunk; rows are `cols` apart
  int count = 0;                 // rows in the chunk (<= kMax)
  float* row = nullptr;
  std::size_t cols = 0;
  const float* coef = nullptr;   // update: the chunk's coefficients (device, `count` values)
  float* dots = nullptr;         // dots: receives `count` dot products (device)
  float eps = 0.0f;
  OrthoWork* work = nullptr;
};

// Sums acc[i] over the block for the values `wanted` selects (a block-uniform choice) into total[i] (shared).
template <int kValues, typename Wanted>
__device__ __forceinline__ void block_sum(const double (&acc)[kValues], Wanted wanted, double (*warp_sums)[kValues],
                                          double* total) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  __syncthreads();  // warp_sums and total may still be read from an earlier call
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    if (!wanted(i)) continue;
    double v = acc[i];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, offset);
    if (lane == 0) warp_sums[warp][i] = v;
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kValues; i += static_cast<int>(blockDim.x)) {
    if (!wanted(i)) continue;
    double t = 0.0;
    for (unsigned w = 0; w < kWarps; ++w) t += warp_sums[w][i];
    total[i] = t;
  }
  __syncthreads();
}

template <int kMax, bool kUpdate, bool kDots, bool kSquares>
__global__ void __launch_bounds__(kThreads) project_kernel(ProjectArgs a) {
  constexpr int kValues = kMax + 1;
  __shared__ float coef[kMax];
  __shared__ double warp_sums[kWarps][kValues];
  __shared__ double total[kValues];
  __shared__ bool last;
  const int count = a.count;
  const auto wanted = [count](int i) { return (kDots && i < count) || (kSquares && i == kMax); };

  if constexpr (kUpdate) {
    for (int i = static_cast<int>(threadIdx.x); i < kMax; i += static_cast<int>(blockDim.x)) {
      coef[i] = i < count ? a.coef[i] : 0.0f;
    }
    __syncthreads();
  }
  double acc[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) acc[i] = 0.0;

  const std::size_t cols = a.cols;
  for (std::size_t c = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; c < cols;
       c += std::size_t{gridDim.x} * blockDim.x) {
    float x = a.row[c];
    if constexpr (kUpdate) {
#pragma unroll
      for (int i = 0; i < kMax; ++i) {
        if (i < count) x -= coef[i] * a.prior[static_cast<std::size_t>(i) * cols + c];
      }
      // Stored before the dots: the dots then load the chunk again (from L1) instead of holding kMax more values
      // in registers across both loops.
      a.row[c] = x;
    }
    if constexpr (kDots) {
#pragma unroll
      for (int i = 0; i < kMax; ++i) {
        if (i < count) acc[i] += static_cast<double>(a.prior[static_cast<std::size_t>(i) * cols + c]) * x;
      }
    }
    if constexpr (kSquares) acc[kMax] += static_cast<double>(x) * x;
  }

  block_sum(acc, wanted, warp_sums, total);
  OrthoWork& work = *a.work;
  for (int i = static_cast<int>(threadIdx.x); i < kValues; i += static_cast<int>(blockDim.x)) {
    if (wanted(i)) work.partial[i][blockIdx.x] = total[i];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&work.arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;

  // The last block: every partial is written (each block fenced before it arrived). Read them past L1.
  __threadfence();
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    acc[i] = 0.0;
    if (!wanted(i)) continue;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) acc[i] += __ldcg(&work.partial[i][b]);
  }
  block_sum(acc, wanted, warp_sums, total);
  if constexpr (kDots) {
    for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
      a.dots[i] = static_cast<float>(total[i]);
    }
  }
  if (threadIdx.x == 0) {
    if constexpr (kSquares) work.divisor = static_cast<float>(sqrt(total[kMax])) + a.eps;
    work.arrivals = 0;
  }
}

// row /= divisor, or row = 0 when the divisor is 0 (as the host loop: IEEE division, nvcc's default).
__global__ void __launch_bounds__(kThreads) divide_kernel(float* row, std::size_t cols, const OrthoWork* work) {
  const float divisor = work->divisor;
  for (std::size_t c = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; c < cols;
       c += std::size_t{gridDim.x} * blockDim.x) {
    row[c] = divisor == 0.0f ? 0.0f : row[c] / divisor;
  }
}

template <int kMax, bool kUpdate, bool kDots, bool kSquares>
void project(const ProjectArgs& args, cudaStream_t stream) {
  const auto kernel = project_kernel<kMax, kUpdate, kDots, kSquares>;
  const unsigned grid = std::min(grid_for(args.cols, kThreads, kernel), kMaxBlocks);
  kernel<<<grid, kThreads, 0, stream>>>(args);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

// The smallest instantiation that holds the chunk: fewer registers for the usual ranks (1 .. 16).
template <bool kUpdate, bool kDots, bool kSquares>
void project_chunk(const ProjectArgs& args, cudaStream_t stream) {
  if (args.count <= 4) {
    project<4, kUpdate, kDots, kSquares>(args, stream);
  } else if (args.count <= 16) {
    project<16, kUpdate, kDots, kSquares>(args, stream);
  } else {
    project<kChunk, kUpdate, kDots, kSquares>(args, stream);
  }
}

}  // namespace

void launch_lowrank_add(float* y, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads, add_kernel), kThreads, 0, stream>>>(y, x, n);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_lowrank_scale(float* x, std::size_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kThreads, scale_kernel), kThreads, 0, stream>>>(x, n, s);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_lowrank_store(const float* values, float s, void* out, LowRankDType dtype, std::size_t n, bool accumulate,
                          cudaStream_t stream) {
  if (n == 0) return;
  switch (dtype) {
    case LowRankDType::kF32: {
      const auto kernel = store_kernel<LowRankDType::kF32>;
      kernel<<<grid_for(n, kThreads, kernel), kThreads, 0, stream>>>(values, s, out, n, accumulate);
      break;
    }
    case LowRankDType::kF16: {
      const auto kernel = store_kernel<LowRankDType::kF16>;
      kernel<<<grid_for(n, kThreads, kernel), kThreads, 0, stream>>>(values, s, out, n, accumulate);
      break;
    }
    case LowRankDType::kBF16: {
      const auto kernel = store_kernel<LowRankDType::kBF16>;
      kernel<<<grid_for(n, kThreads, kernel), kThreads, 0, stream>>>(values, s, out, n, accumulate);
      break;
    }
  }
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_lowrank_fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step,
                                cudaStream_t stream) {
  if (n == 0) return;
  const PhiloxStream philox = PhiloxStream::make(seed, key, step);
  fill_random_kernel<<<grid_for((n + 3) / 4, kThreads, fill_random_kernel), kThreads, 0, stream>>>(x, n, philox);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_lowrank_scale_matrix(float* c, std::size_t m, std::size_t n, std::size_t ldc, float beta,
                                 cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  scale_matrix_kernel<<<grid_for(m * n, kThreads, scale_matrix_kernel), kThreads, 0, stream>>>(c, m, n, ldc, beta);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_lowrank_outer(float* c, std::size_t m, std::size_t n, std::size_t ldc, float alpha, const float* x,
                         std::size_t x_stride, const float* y, std::size_t y_stride, float beta, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  // As many blocks as a grid-stride kernel over m * n elements gets: across the columns first, the rest over rows.
  constexpr std::size_t kMaxGridY = 65535;
  const std::size_t blocks = grid_for(m * n, kThreads, outer_kernel);
  const std::size_t grid_x = std::min((n + kThreads - 1) / kThreads, blocks);
  const std::size_t grid_y = std::min({m, std::max<std::size_t>(1, blocks / grid_x), kMaxGridY});
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  outer_kernel<<<grid, kThreads, 0, stream>>>(c, m, n, ldc, alpha, x, x_stride, y, y_stride, beta);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_find_nonfinite(const float* x, std::size_t n, unsigned long long* result, cudaStream_t stream) {
  const unsigned long long initial[2] = {0ull, ~0ull};
  launch_write_bytes(result, initial, sizeof(initial), stream);
  if (n == 0) return;
  find_nonfinite_kernel<<<grid_for(n, kThreads, find_nonfinite_kernel), kThreads, 0, stream>>>(x, n, result);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

std::size_t orthonormalize_workspace_bytes() { return (sizeof(OrthoWork) + 255) / 256 * 256; }

void launch_orthonormalize_rows(float* v, std::size_t rows, std::size_t cols, float eps, void* workspace,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  auto* work = static_cast<OrthoWork*>(workspace);
  float* const coef0 = reinterpret_cast<float*>(reinterpret_cast<char*>(work) + offsetof(OrthoWork, coef));
  float* const coef1 = coef0 + kChunk;
  // The last block of each project kernel resets the counter; zero it here too, so that a call after an aborted one
  // (an error between launches) starts clean.
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<char*>(work) + offsetof(OrthoWork, arrivals), 0,
                                      sizeof(unsigned), stream));
  const unsigned divide_grid = grid_for(cols, kThreads, divide_kernel);
  for (std::size_t j = 0; j < rows; ++j) {
    ProjectArgs args;
    args.row = v + j * cols;
    args.cols = cols;
    args.eps = eps;
    args.work = work;
    if (j == 0) {
      project<4, false, false, true>(args, stream);
    } else if (j <= static_cast<std::size_t>(kChunk)) {
      // One chunk: dots; remove them and take the dots again; remove those and take the norm.
      args.prior = v;
      args.count = static_cast<int>(j);
      args.dots = coef0;
      project_chunk<false, true, false>(args, stream);
      args.coef = coef0;
      args.dots = coef1;
      project_chunk<true, true, false>(args, stream);
      args.coef = coef1;
      args.dots = nullptr;
      project_chunk<true, false, true>(args, stream);
    } else {
      // Chunk after chunk, twice; the last update also takes the norm.
      for (int pass = 0; pass < 2; ++pass) {
        for (std::size_t start = 0; start < j; start += kChunk) {
          args.prior = v + start * cols;
          args.count = static_cast<int>(std::min<std::size_t>(kChunk, j - start));
          args.coef = nullptr;
          args.dots = coef0;
          project_chunk<false, true, false>(args, stream);
          args.coef = coef0;
          args.dots = nullptr;
          if (pass == 1 && start + kChunk >= j) {
            project_chunk<true, false, true>(args, stream);
          } else {
            project_chunk<true, false, false>(args, stream);
          }
        }
      }
    }
    divide_kernel<<<divide_grid, kThreads, 0, stream>>>(args.row, cols, work);
    GRADCOMP_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace gradcomp::kernels
