#include "kernels/randomk_cuda.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "kernels/common_cuda.h"
#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#include "kernels/randomk_ops.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bits that hold every value below n (the radix sort's end bit).
int value_bits(std::uint64_t n) {
  int bits = 1;
  while (bits < 32 && (std::uint64_t{1} << bits) < n) ++bits;
  return bits;
}

// Workspace: draws (values, steps), sorted draws, candidates (items, flags), the selected count, CUB's temp.
struct Layout {
  std::size_t values, steps, sorted_values, sorted_steps, items, flags, count, temp, temp_bytes, total;
};

Layout layout_of(std::uint64_t n, std::uint64_t k) {
  const std::size_t m = static_cast<std::size_t>(k > 0 ? k : 1);
  std::size_t sort_bytes = 0, select_bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                      static_cast<std::uint32_t*>(nullptr),
                                                      static_cast<const std::uint32_t*>(nullptr),
                                                      static_cast<std::uint32_t*>(nullptr), static_cast<int>(m), 0,
                                                      value_bits(n)));
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, select_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                 static_cast<const unsigned char*>(nullptr),
                                                 static_cast<std::uint32_t*>(nullptr), static_cast<int*>(nullptr),
                                                 static_cast<int>(2 * m)));
  Layout l{};
  std::size_t at = 0;
  l.values = at, at += align256(m * 4);
  l.steps = at, at += align256(m * 4);
  l.sorted_values = at, at += align256(m * 4);
  l.sorted_steps = at, at += align256(m * 4);
  l.items = at, at += align256(2 * m * 4);
  l.flags = at, at += align256(2 * m);
  l.count = at, at += 256;
  l.temp = at;
  l.temp_bytes = std::max(sort_bytes, select_bytes);
  l.total = at + align256(l.temp_bytes);
  return l;
}

__global__ void draw_kernel(FloydDraws d, std::uint32_t* values, std::uint32_t* steps) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < d.k;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t j = d.n - d.k + i;
    steps[i] = static_cast<std::uint32_t>(j);
    values[i] = static_cast<std::uint32_t>(floyd_draw(d, j));
  }
}

__global__ void decide_kernel(FloydDraws d, std::uint32_t* items, unsigned char* flags) {
  for (std::uint64_t c = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; c < 2 * d.k;
       c += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t item = 0;
    flags[c] = floyd_candidate_picked(d, c, item) ? 1 : 0;
    items[c] = item;
  }
}

__global__ void iota_kernel(std::int32_t* out, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<std::int32_t>(i);
  }
}

}  // namespace

std::size_t randomk_workspace_bytes(std::uint64_t n, std::uint64_t k) { return layout_of(n, k).total; }

void launch_randomk_indices(std::uint64_t seed, std::uint64_t tensor_key, std::uint64_t step, std::uint64_t n,
                            std::uint64_t k, std::int32_t* indices, void* workspace, cudaStream_t stream) {
  if (k == 0) return;
  if (k == n) {  // every index, as randomk_indices() returns
    iota_kernel<<<grid_for(n, kThreads, iota_kernel), kThreads, 0, stream>>>(indices, n);
    GRADCOMP_CUDA_LAUNCH_CHECK();
    return;
  }
  const Layout l = layout_of(n, k);
  auto* base = static_cast<std::byte*>(workspace);
  auto* values = reinterpret_cast<std::uint32_t*>(base + l.values);
  auto* steps = reinterpret_cast<std::uint32_t*>(base + l.steps);
  auto* sorted_values = reinterpret_cast<std::uint32_t*>(base + l.sorted_values);
  auto* sorted_steps = reinterpret_cast<std::uint32_t*>(base + l.sorted_steps);
  auto* items = reinterpret_cast<std::uint32_t*>(base + l.items);
  auto* flags = reinterpret_cast<unsigned char*>(base + l.flags);
  auto* count = reinterpret_cast<int*>(base + l.count);
  FloydDraws d;
  d.n = n;
  d.k = k;
  d.stream = randomk_stream(seed, tensor_key, step);
  draw_kernel<<<grid_for(k, kThreads, draw_kernel), kThreads, 0, stream>>>(d, values, steps);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  std::size_t temp_bytes = l.temp_bytes;
  // Stable: equal draws keep their step order, which the decisions rely on.
  GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + l.temp, temp_bytes, values, sorted_values, steps,
                                                      sorted_steps, static_cast<int>(k), 0, value_bits(n), stream));
  d.values = sorted_values;
  d.steps = sorted_steps;
  decide_kernel<<<grid_for(2 * k, kThreads, decide_kernel), kThreads, 0, stream>>>(d, items, flags);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  temp_bytes = l.temp_bytes;
  // The picked candidates in candidate order are the ascending indices (exactly k of them).
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::Flagged(base + l.temp, temp_bytes, items, flags,
                                                 reinterpret_cast<std::uint32_t*>(indices), count,
                                                 static_cast<int>(2 * k), stream));
}

}  // namespace gradcomp::kernels
