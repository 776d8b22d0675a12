// Launchers of the sparsifiers' CUDA kernels (CUDA builds only): exact top-k by a three-pass radix select of the
// magnitude keys (11 + 11 + 9 bits, kernels/sparsify_ops.cuh's order: larger key first, lower index on ties) and a
// stable CUB compaction that writes the selected indices, ascending, straight into the payload; the value gather with
// the residual update; and the validated scatter of (index, value) payloads (no atomics: indices are strictly
// increasing, so no two threads of one payload write the same element, and several payloads accumulate in stream
// order). Every launcher takes the stream; none allocates (workspace sized by topk_workspace_bytes).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda_counters.cuh"
#include "kernels/philox_ops.cuh"

namespace gradcomp::kernels {

// What the radix select found (device struct; read back by the host once per top-k).
struct TopkSelectState {
  std::uint32_t prefix;      // after the last pass: the k-th largest key T
  std::uint32_t k_remaining; // after the last pass: how many elements with key == T to take (lowest indices first)
  std::uint32_t bin_count;   // after the last pass: how many elements have key == T
  std::uint32_t pad;
};

// Device workspace of one top-k over n elements.
std::size_t topk_workspace_bytes(std::size_t n);

// Result of the select phase, on the host.
struct TopkThreshold {
  std::uint32_t key = 0;     // T
  std::uint32_t take_ties = 0;
  std::uint32_t ties = 0;
};

// Pass 1..3 of the radix select over `values` (n floats). When `grad` is non-null, pass 1 first computes
// values[i] = residual[i] + grad[i] (error feedback, written to `values`) and counts grad's non-finite entries; else
// `values` is read as is (and its non-finite entries are counted). Synchronizes the stream once to return T.
TopkThreshold topk_threshold(const float* grad, const float* residual, float* values, std::size_t n, std::size_t k,
                             void* workspace, DeviceCounters* counters, cudaStream_t stream);

// Writes the indices of the k selected elements (key > T, plus the lowest-index take_ties elements with key == T),
// ascending, into `indices` (k int32). Returns nothing; the count is k by construction.
void topk_compact(const float* values, std::size_t n, const TopkThreshold& threshold, std::int32_t* indices,
                  void* workspace, cudaStream_t stream);

// For j < k: i = indices[j], v = values[i]; writes v * prescale (f32, or saturating f16 bits when f16) to
// values_out[j]; when residual_out is non-null sets residual_out[i] = v - transmitted (in gradient units), as the
// CPU codec does. Counts saturated f16 values into counters->saturated.
void launch_sparse_gather(const float* values, const std::int32_t* indices, std::size_t k, float prescale, bool f16,
                          void* values_out, float* residual_out, DeviceCounters* counters, cudaStream_t stream);

// values[i] = residual[i] + grad[i] (ef_accumulate) when residual is non-null; counts grad's non-finite entries.
void launch_ef_accumulate(const float* grad, const float* residual, float* values, std::size_t n,
                          DeviceCounters* counters, cudaStream_t stream);

// blocktopk: for each block b of `block` elements (the last may be shorter), v = residual + grad written to values
// when residual is non-null, and keys[b] = magnitude_key(sum of v^2 by block_norm_step in index order). Counts grad's
// non-finite entries. One warp per block; each block's sum is one sequential chain in index order, as on the CPU.
// The block kernels live in kernels/blocktopk_cuda.cu.
void launch_block_norms(const float* grad, const float* residual, float* values, std::size_t n, std::size_t block,
                        std::uint32_t* keys, DeviceCounters* counters, cudaStream_t stream);

// blocktopk gather: for selected block j (ids ascending), its elements go to body[j * block + e] (times prescale), and
// the residual of every sent element becomes v - transmitted.
void launch_block_gather(const float* values, const std::int32_t* ids, std::size_t count, std::size_t block,
                         std::size_t n, float prescale, float* body, float* residual_out, cudaStream_t stream);

// blocktopk decode: out[ids[j] * block + e] (+)= body[j * block + e]; zeroes out first unless accumulating.
void launch_block_scatter(const std::int32_t* ids, std::size_t count, std::size_t block, std::size_t n,
                          const float* body, float* out, bool accumulate, cudaStream_t stream);

// DGC (Lin et al. 2018) pieces, matching compressors/codecs/dgc.cc bit for bit.
// Local clipping factor: ||g||_2 from per-64K-chunk double sums (sequential within a chunk) combined in chunk order;
// writes scale = clip / norm when norm > clip, else 1, to *scale_out (device). `partial` holds one double per chunk.
void launch_dgc_clip_scale(const float* grad, std::size_t n, double clip, double* partial, float* scale_out,
                           cudaStream_t stream);
// u' = momentum correction of (g * *scale), v' accumulated (kernels/sparsify_ops.cuh dgc_accumulate), reading u, v
// and writing u_out, v_out; counts grad's non-finite entries.
void launch_dgc_accumulate(const float* grad, const float* scale, const float* u, const float* v, float* u_out,
                           float* v_out, std::size_t n, float momentum, bool nesterov, DeviceCounters* counters,
                           cudaStream_t stream);
// compressors/codecs/dgc.cc's stratified sample: in each 64K chunk c (begin = c * 65536, length L), draws j < ceil(sample*L)
// take keys[c * full_draws + j] = magnitude_key(v[begin + uniform_below32(stream.bits(begin + j), L)]), as float bit
// patterns; `samples` is the total number of draws.
void launch_dgc_sample(const float* v, std::size_t n, const PhiloxStream& stream, std::size_t full_draws,
                       std::size_t samples, float* keys, cudaStream_t stream_cuda);
// Stable list of the indices whose key is >= threshold_key; returns their count (synchronizes once). `indices` has
// room for n entries; workspace is topk_workspace_bytes(n).
std::size_t collect_at_least(const float* values, std::size_t n, std::uint32_t threshold_key, std::int32_t* indices,
                             void* workspace, cudaStream_t stream);
// target[indices[j]] = 0 for j < k.
void launch_zero_at(const std::int32_t* indices, std::size_t k, float* target, cudaStream_t stream);

// Sets *error_flag when indices[0..k) are not strictly increasing or not in [0, limit).
void launch_validate_indices(const std::int32_t* indices, std::size_t k, std::uint64_t limit, int* error_flag,
                             cudaStream_t stream);

// out[indices[j]] (+)= value j (f32 or f16 bits); positions not named are zeroed first unless accumulating.
void launch_sparse_scatter(const std::int32_t* indices, const void* values, bool f16, std::size_t k, float* out,
                           std::size_t numel, bool accumulate, cudaStream_t stream);

}  // namespace gradcomp::kernels
