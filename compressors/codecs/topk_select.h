// Exact, deterministic top-k selection on the CPU, shared by the topk, blocktopk and dgc codecs.
//
// Order: larger magnitude key first, lower index on ties (kernels/sparsify_ops.cuh, ranks_before). Results are
// returned as ascending indices and never depend on the thread count: histograms are exact integer sums, candidate
// lists are concatenated in fixed-chunk order, and the final choice is a serial function of (keys, indices).
//
// Algorithm (a one-pass radix select): a 65,536-bin histogram of the keys' top 16 bits finds the bucket B that holds
// the k-th largest key; one more pass collects the indices whose bucket is >= B (about k plus one bucket's worth);
// nth_element over those candidates' keys finds the exact k-th key T, and a serial filter in index order keeps every
// candidate with key > T plus the lowest-index ones with key == T.
//
// Sampled bound (the codecs' fast path, docs/sparsifiers.md): a fixed, deterministic sample of one position per
// kSampleBlock elements gives a key T that, with overwhelming probability, at least k elements reach; the codec then
// collects every element with key >= T (with its value) in the same pass that writes its buffer, and the exact top-k
// is chosen among those candidates. If fewer than k reach T (an adversarial layout), the codec falls back to the
// histogram select: the result is exact either way, only the speed depends on the sample.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/select_collect.h"

namespace gradcomp::kernels {

// Elements per histogram chunk (a multiple of kParallelChunk, so chunk boundaries are thread-count independent).
inline constexpr std::size_t kSelectChunk = std::size_t{1} << 20;

// Tensors up to this many elements are selected with a 2,048-bin histogram built by select_topk itself: clearing and
// walking 65,536 bins costs more than the whole selection of a small gradient (compressors_bench, topk round trip,
// 1 thread: 10 KB 22 -> 7 us, 64 KB 38 -> 31 us; even at 128 KB).
inline constexpr std::size_t kDirectSelectMax = std::size_t{1} << 15;

// Per-chunk key histograms: `chunks` rows of kKeyBuckets counts. Row c counts the keys of elements
// [c*kSelectChunk, (c+1)*kSelectChunk).
struct KeyHistogram {
  std::vector<std::uint32_t> counts;  // chunks * kKeyBuckets
  std::size_t chunks = 0;
  // Sizes and zeroes the rows for n elements.
  void reset(std::size_t n);
  std::uint32_t* row(std::size_t chunk) { return counts.data() + chunk * (std::size_t{1} << 16); }
};

// Adds the magnitude keys of values[begin, end) to `row` (kKeyBuckets counts).
void add_key_histogram(const float* values, std::size_t begin, std::size_t end, std::uint32_t* row);

// Exact top-k of |values[0, n)| (magnitude keys). `histogram`, when given, must already hold the keys of every
// element (e.g. built while the values were written); otherwise it is computed here (for n <=
// kDirectSelectMax a 2,048-bin one: the same result). Writes the selected indices,
// ascending, into `out` (resized to min(k, n)).
void select_topk(const float* values, std::size_t n, std::size_t k, int threads, std::vector<std::uint32_t>& out,
                 KeyHistogram* histogram = nullptr);

// Exact top-k among `candidates` (ascending indices into `keys_of`): keeps the k best by (key desc, index asc),
// ascending in `out`. `key_of(i)` returns the 32-bit key of index i.
template <typename KeyOf>
void select_among(KeyOf key_of, std::span<const std::uint32_t> candidates, std::size_t k,
                  std::vector<std::uint32_t>& out);

// Indices i in [0, n) with magnitude_key(values[i]) >= threshold_key, ascending.
void collect_at_least(const float* values, std::size_t n, std::uint32_t threshold_key, int threads,
                      std::vector<std::uint32_t>& out);

// One sample position per this many elements.
inline constexpr std::size_t kSampleBlock = 256;

// Sample positions of an n-element tensor: one per kSampleBlock block, at a fixed pseudo-random offset inside it.
inline std::size_t sample_count(std::size_t n) { return (n + kSampleBlock - 1) / kSampleBlock; }
inline std::size_t sample_position(std::size_t s, std::size_t n) {
  const std::size_t begin = s * kSampleBlock;
  const std::size_t length = std::min(kSampleBlock, n - begin);
  const std::uint32_t mixed = static_cast<std::uint32_t>(s) * 0x9E3779B1u;
  return begin + static_cast<std::size_t>((static_cast<std::uint64_t>(mixed ^ (mixed >> 15)) * length) >> 32);
}

// From the sampled keys (reordered in place) of an n-element tensor, a key that at least k elements reach with high
// probability (the sample rank 1.05 h + 4 sqrt(h) + 1 of h = k * samples / n expected hits). Returns false when
// sampling does not pay: too few expected hits (h < 8), k > n / 8, or many sampled keys tie at the bound (an all-zero
// tensor would make every element a candidate); the caller then uses select_topk.
bool sampled_lower_bound(std::vector<std::uint32_t>& sample_keys, std::size_t n, std::size_t k,
                         std::uint32_t& threshold_key);

// Exact top-k of `candidates` by (key desc, index asc): writes the chosen positions into the candidate list,
// ascending, into `out` (resized to min(k, size)).
void select_among_candidates(const Candidates& candidates, std::size_t k, std::vector<std::uint32_t>& out);

// Concatenates `parts` in order into `out` (cleared first).
void concat_candidates(const std::vector<Candidates>& parts, Candidates& out);

}  // namespace gradcomp::kernels

#include "compressors/codecs/topk_select_inl.h"
