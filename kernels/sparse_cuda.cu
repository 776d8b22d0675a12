#include "kernels/sparse_cuda.h"

#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "kernels/common_cuda.h"
#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_reduce.cuh"
#include "kernels/half_ops.cuh"
#include "kernels/sparsify_ops.cuh"
#include "kernels/wire_nan.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBins = 2048;
// Radix digits of the 31-bit magnitude key, most significant first: bits [20, 31), [9, 20), [0, 9).
__host__ __device__ constexpr int shift_of(int pass) { return pass == 0 ? 20 : (pass == 1 ? 9 : 0); }
__host__ __device__ constexpr int width_of(int pass) { return pass == 2 ? 9 : 11; }

// Workspace layout (each piece 256-byte aligned).
constexpr std::size_t kHistOffset = 0;                                  // kMaxBins u32
constexpr std::size_t kStateOffset = kMaxBins * sizeof(std::uint32_t);  // TopkSelectState
constexpr std::size_t kCountOffset = kStateOffset + 256;                // selected count (i64)
constexpr std::size_t kTiesOffset = kCountOffset + 256;                 // n int32 (tie indices), then CUB temp

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Stable selection predicates over element indices.
struct AtLeast {
  const float* values;
  std::uint32_t key;
  __device__ bool operator()(std::int32_t i) const { return magnitude_key(values[i]) >= key; }
};
struct Equal {
  const float* values;
  std::uint32_t key;
  __device__ bool operator()(std::int32_t i) const { return magnitude_key(values[i]) == key; }
};
// key > T, or key == T at an index no later than the last tie taken (ties[take - 1], read from device memory).
struct AboveOrEarlyTie {
  const float* values;
  std::uint32_t key;
  const std::int32_t* last_tie;
  __device__ bool operator()(std::int32_t i) const {
    const std::uint32_t k = magnitude_key(values[i]);
    return k > key || (k == key && i <= *last_tie);
  }
};

template <typename Predicate>
std::size_t select_temp_bytes(std::size_t n) {
  std::size_t bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<std::int32_t>(0),
                                            static_cast<std::int32_t*>(nullptr), static_cast<long long*>(nullptr),
                                            static_cast<std::int64_t>(n), Predicate{}, cudaStream_t{}));
  return bytes;
}

std::size_t cub_temp_bytes(std::size_t n) {
  std::size_t bytes = select_temp_bytes<AtLeast>(n);
  bytes = std::max(bytes, select_temp_bytes<Equal>(n));
  bytes = std::max(bytes, select_temp_bytes<AboveOrEarlyTie>(n));
  return bytes;
}

// One radix pass: a shared-memory histogram of the digit of every key whose higher digits equal the prefix found so
// far, added into the global histogram with one integer atomic per non-empty bin per block (exact, order-free).
template <int Pass>
__global__ void __launch_bounds__(kThreads) radix_histogram_kernel(const float* grad, const float* residual,
                                                                   float* values, std::size_t n,
                                                                   const TopkSelectState* state, std::uint32_t* hist,
                                                                   DeviceCounters* counters) {
  constexpr int kShift = shift_of(Pass);
  constexpr int kWidth = width_of(Pass);
  constexpr unsigned kBins = 1u << kWidth;
  __shared__ std::uint32_t local[kBins];
  for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const std::uint32_t prefix = Pass == 0 ? 0u : state->prefix;
  unsigned long long nonfinite = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float v;
    if (Pass == 0 && grad != nullptr) {
      const float g = grad[i];
      nonfinite += !isfinite(g);
      v = residual ? ef_accumulate(residual[i], g) : g;
      if (residual) values[i] = v;
    } else {
      v = values[i];
      if (Pass == 0) nonfinite += !isfinite(v);
    }
    const std::uint32_t key = magnitude_key(v);
    if (Pass > 0 && (key >> (kShift + kWidth)) != prefix) continue;
    atomicAdd(&local[(key >> kShift) & (kBins - 1)], 1u);
  }
  if (Pass == 0) warp_count(nonfinite, &counters->nonfinite);
  __syncthreads();
  for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (local[b]) atomicAdd(&hist[b], local[b]);
  }
}

// Finds the bin holding the want-th largest key and extends the prefix: the highest bin b whose suffix count
// S(b) = hist[b] + hist[b+1] + ... reaches `want`. One block of kPickThreads threads computes the suffix counts as an
// inclusive scan of the bins in descending order (thread t owns descending positions [t*kItems, (t+1)*kItems)), and
// the one thread owning the position where the running count first reaches `want` writes the result. The first pass
// takes k as an argument (prefix 0), so nothing is copied from the host to start a select.
constexpr unsigned kPickThreads = 256;
template <int Pass>
__global__ void __launch_bounds__(kPickThreads) pick_bin_kernel(const std::uint32_t* hist, std::uint32_t k,
                                                                TopkSelectState* state) {
  constexpr unsigned kBins = 1u << width_of(Pass);
  constexpr unsigned kItems = kBins / kPickThreads;
  using Scan = cub::BlockScan<std::uint32_t, kPickThreads>;
  __shared__ typename Scan::TempStorage temp;
  const std::uint32_t want = Pass == 0 ? k : state->k_remaining;
  const std::uint32_t prefix = Pass == 0 ? 0u : state->prefix;
  std::uint32_t counts[kItems], suffix[kItems];
#pragma unroll
  for (unsigned j = 0; j < kItems; ++j) counts[j] = hist[kBins - 1 - (threadIdx.x * kItems + j)];
  Scan(temp).InclusiveSum(counts, suffix);  // synchronizes the block: every thread has read the state by now
#pragma unroll
  for (unsigned j = 0; j < kItems; ++j) {
    const unsigned position = threadIdx.x * kItems + j;
    const std::uint32_t before = suffix[j] - counts[j];
    // want == 0 (never asked for) takes the top bin, as a serial walk from the top would.
    if (suffix[j] >= want && (before < want || position == 0)) {
      const unsigned b = kBins - 1 - position;
      state->prefix = (prefix << width_of(Pass)) | b;
      state->k_remaining = want - before;
      state->bin_count = counts[j];
    }
  }
}

__global__ void gather_kernel(const float* values, const std::int32_t* indices, std::size_t k, float prescale,
                              bool f16, void* values_out, float* residual_out, DeviceCounters* counters) {
  unsigned long long saturated = 0;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < k;
       j += std::size_t{gridDim.x} * blockDim.x) {
    const std::int32_t i = indices[j];
    const float v = values[i];
    const float wire = v * prescale;
    float decoded = wire;
    if (f16) {
      bool clamped = false;
      const std::uint16_t bits = sparse_value_to_half(wire, clamped);
      saturated += clamped;
      static_cast<std::uint16_t*>(values_out)[j] = bits;
      decoded = half_bits_to_float(bits);
    } else {
      static_cast<float*>(values_out)[j] = wire_f32(wire);  // one NaN on the wire (kernels/wire_nan.cuh)
    }
    if (residual_out) residual_out[i] = prescale == 1.0f ? v - decoded : v - decoded / prescale;
  }
  warp_count(saturated, &counters->saturated);
}

__global__ void ef_accumulate_kernel(const float* grad, const float* residual, float* values, std::size_t n,
                                     DeviceCounters* counters) {
  unsigned long long nonfinite = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    nonfinite += !isfinite(g);
    if (residual) values[i] = ef_accumulate(residual[i], g);
  }
  warp_count(nonfinite, &counters->nonfinite);
}

__global__ void zero_at_kernel(const std::int32_t* indices, std::size_t k, float* target) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < k;
       j += std::size_t{gridDim.x} * blockDim.x) {
    target[indices[j]] = 0.0f;
  }
}

__global__ void validate_indices_kernel(const std::int32_t* indices, std::size_t k, std::uint64_t limit,
                                        int* error_flag) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < k;
       j += std::size_t{gridDim.x} * blockDim.x) {
    const long long index = indices[j];
    const long long previous = j == 0 ? -1 : indices[j - 1];
    if (!(index > previous && static_cast<std::uint64_t>(index) < limit)) atomicExch(error_flag, 1);
  }
}

// Race-free without atomics: indices are validated strictly increasing, so each j writes its own element.
__global__ void scatter_kernel(const std::int32_t* indices, const void* values, bool f16, std::size_t k, float* out,
                               bool accumulate) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < k;
       j += std::size_t{gridDim.x} * blockDim.x) {
    const float value = f16 ? half_bits_to_float(static_cast<const std::uint16_t*>(values)[j])
                            : static_cast<const float*>(values)[j];
    const std::int32_t i = indices[j];
    out[i] = accumulate ? out[i] + value : value;
  }
}

}  // namespace

std::size_t topk_workspace_bytes(std::size_t n) {
  return kTiesOffset + align256(std::max<std::size_t>(n, 1) * sizeof(std::int32_t)) + align256(cub_temp_bytes(n));
}

TopkThreshold topk_threshold(const float* grad, const float* residual, float* values, std::size_t n, std::size_t k,
                             void* workspace, DeviceCounters* counters, cudaStream_t stream) {
  auto* base = static_cast<std::byte*>(workspace);
  auto* hist = reinterpret_cast<std::uint32_t*>(base + kHistOffset);
  auto* state = reinterpret_cast<TopkSelectState*>(base + kStateOffset);
  const auto k32 = static_cast<std::uint32_t>(k);
  const unsigned blocks = grid_for(n, kThreads, radix_histogram_kernel<0>);  // the heaviest of the three passes
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(hist, 0, kMaxBins * sizeof(std::uint32_t), stream));
  radix_histogram_kernel<0><<<blocks, kThreads, 0, stream>>>(grad, residual, values, n, state, hist, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  pick_bin_kernel<0><<<1, kPickThreads, 0, stream>>>(hist, k32, state);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(hist, 0, kMaxBins * sizeof(std::uint32_t), stream));
  radix_histogram_kernel<1><<<blocks, kThreads, 0, stream>>>(nullptr, nullptr, values, n, state, hist, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  pick_bin_kernel<1><<<1, kPickThreads, 0, stream>>>(hist, k32, state);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(hist, 0, kMaxBins * sizeof(std::uint32_t), stream));
  radix_histogram_kernel<2><<<blocks, kThreads, 0, stream>>>(nullptr, nullptr, values, n, state, hist, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  pick_bin_kernel<2><<<1, kPickThreads, 0, stream>>>(hist, k32, state);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  TopkSelectState result{};
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&result, state, sizeof(result), cudaMemcpyDeviceToHost, stream));
  kernels::synchronize_stream(stream);
  return TopkThreshold{result.prefix, result.k_remaining, result.bin_count};
}

void topk_compact(const float* values, std::size_t n, const TopkThreshold& threshold, std::int32_t* indices,
                  void* workspace, cudaStream_t stream) {
  auto* base = static_cast<std::byte*>(workspace);
  auto* count = reinterpret_cast<long long*>(base + kCountOffset);
  auto* ties = reinterpret_cast<std::int32_t*>(base + kTiesOffset);
  void* temp = base + kTiesOffset + align256(std::max<std::size_t>(n, 1) * sizeof(std::int32_t));
  std::size_t temp_bytes = cub_temp_bytes(n);
  const thrust::counting_iterator<std::int32_t> first(0);
  const auto items = static_cast<std::int64_t>(n);
  if (threshold.take_ties == threshold.ties) {  // every element with key >= T is selected
    GRADCOMP_CUDA_CHECK(
        cub::DeviceSelect::If(temp, temp_bytes, first, indices, count, items, AtLeast{values, threshold.key}, stream));
    return;
  }
  // Some ties are left out: list the ties in index order, then keep key > T and the first take_ties ties.
  GRADCOMP_CUDA_CHECK(
      cub::DeviceSelect::If(temp, temp_bytes, first, ties, count, items, Equal{values, threshold.key}, stream));
  temp_bytes = cub_temp_bytes(n);
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(temp, temp_bytes, first, indices, count, items,
                                            AboveOrEarlyTie{values, threshold.key, ties + threshold.take_ties - 1},
                                            stream));
}

void launch_sparse_gather(const float* values, const std::int32_t* indices, std::size_t k, float prescale, bool f16,
                          void* values_out, float* residual_out, DeviceCounters* counters, cudaStream_t stream) {
  if (k == 0) return;
  const unsigned grid = grid_for(k, kThreads, gather_kernel);
  gather_kernel<<<grid, kThreads, 0, stream>>>(values, indices, k, prescale, f16, values_out, residual_out, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_ef_accumulate(const float* grad, const float* residual, float* values, std::size_t n,
                          DeviceCounters* counters, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, ef_accumulate_kernel);
  ef_accumulate_kernel<<<grid, kThreads, 0, stream>>>(grad, residual, values, n, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

std::size_t collect_at_least(const float* values, std::size_t n, std::uint32_t threshold_key, std::int32_t* indices,
                             void* workspace, cudaStream_t stream) {
  auto* base = static_cast<std::byte*>(workspace);
  auto* count = reinterpret_cast<long long*>(base + kCountOffset);
  void* temp = base + kTiesOffset + align256(std::max<std::size_t>(n, 1) * sizeof(std::int32_t));
  std::size_t temp_bytes = cub_temp_bytes(n);
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<std::int32_t>(0), indices,
                                            count, static_cast<std::int64_t>(n), AtLeast{values, threshold_key},
                                            stream));
  long long host_count = 0;
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&host_count, count, sizeof(host_count), cudaMemcpyDeviceToHost, stream));
  kernels::synchronize_stream(stream);
  return static_cast<std::size_t>(host_count);
}

void launch_zero_at(const std::int32_t* indices, std::size_t k, float* target, cudaStream_t stream) {
  if (k == 0) return;
  const unsigned grid = grid_for(k, kThreads, zero_at_kernel);
  zero_at_kernel<<<grid, kThreads, 0, stream>>>(indices, k, target);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_validate_indices(const std::int32_t* indices, std::size_t k, std::uint64_t limit, int* error_flag,
                             cudaStream_t stream) {
  if (k == 0) return;
  const unsigned grid = grid_for(k, kThreads, validate_indices_kernel);
  validate_indices_kernel<<<grid, kThreads, 0, stream>>>(indices, k, limit, error_flag);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_sparse_scatter(const std::int32_t* indices, const void* values, bool f16, std::size_t k, float* out,
                           std::size_t numel, bool accumulate, cudaStream_t stream) {
  if (!accumulate && numel > 0) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out, 0, numel * sizeof(float), stream));
  if (k == 0) return;
  const unsigned grid = grid_for(k, kThreads, scatter_kernel);
  scatter_kernel<<<grid, kThreads, 0, stream>>>(indices, values, f16, k, out, accumulate);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
