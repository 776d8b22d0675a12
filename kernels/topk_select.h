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
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gradcomp::kernels {

// Elements per histogram chunk (a multiple of kParallelChunk, so chunk boundaries are thread-count independent).
inline constexpr std::size_t kSelectChunk = std::size_t{1} << 20;

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
// element (e.g. built while the values were written); otherwise it is computed here. Writes the selected indices,
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

}  // namespace gradcomp::kernels

#include "kernels/topk_select_inl.h"
