#include "compressors/codecs/topk_select.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <numeric>

#include "kernels/cpu_parallel.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp::kernels {
namespace {

// Indices of values[0, n) whose key satisfies pred(key), ascending; chunks run in parallel and are concatenated in
// chunk order.
template <typename Pred>
void collect_if(const float* values, std::size_t n, int threads, Pred pred, std::vector<std::uint32_t>& out) {
  out.clear();
  if (n == 0) return;
  const std::size_t chunks = (n + kSelectChunk - 1) / kSelectChunk;
  std::vector<std::vector<std::uint32_t>> parts(chunks);
  parallel_chunks(n, kSelectChunk, threads, [&](std::size_t c, std::size_t begin, std::size_t end) {
    auto& part = parts[c];
    // Branch-free compaction through a small stack buffer: hits are rare (~k/n), so a data-dependent branch per
    // element would mispredict on every hit.
    constexpr std::size_t kBlock = 1024;
    std::uint32_t buffer[kBlock];
    for (std::size_t block = begin; block < end; block += kBlock) {
      const std::size_t block_end = std::min(end, block + kBlock);
      std::size_t count = 0;
      for (std::size_t i = block; i < block_end; ++i) {
        buffer[count] = static_cast<std::uint32_t>(i);
        count += pred(magnitude_key(values[i])) ? 1 : 0;
      }
      part.insert(part.end(), buffer, buffer + count);
    }
  });
  std::size_t total = 0;
  for (const auto& part : parts) total += part.size();
  out.reserve(total);
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
}

// select_topk for n <= kDirectSelectMax: the same radix select with a 2,048-bin histogram of the keys' top 11 bits
// (8 KB to clear, against 256 KB for the 65,536 bins a large tensor needs), serial.
void select_topk_small(const float* values, std::size_t n, std::size_t k, std::vector<std::uint32_t>& out) {
  constexpr int kShift = 20;  // keys have 31 bits
  std::array<std::uint32_t, std::size_t{1} << 11> counts{};
  for (std::size_t i = 0; i < n; ++i) ++counts[magnitude_key(values[i]) >> kShift];
  std::size_t above = 0;
  std::uint32_t bucket = counts.size() - 1;
  for (; bucket > 0 && above + counts[bucket] < k; --bucket) above += counts[bucket];
  const std::uint32_t floor = bucket << kShift;
  std::vector<std::uint32_t> candidates(n);
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) {  // branch-free compaction, as collect_if
    candidates[count] = static_cast<std::uint32_t>(i);
    count += magnitude_key(values[i]) >= floor ? 1 : 0;
  }
  candidates.resize(count);
  select_among([values](std::uint32_t i) { return magnitude_key(values[i]); },
               std::span<const std::uint32_t>(candidates), k, out);
}

}  // namespace

void KeyHistogram::reset(std::size_t n) {
  chunks = (n + kSelectChunk - 1) / kSelectChunk;
  counts.assign(chunks * kKeyBuckets, 0u);
}

void add_key_histogram(const float* values, std::size_t begin, std::size_t end, std::uint32_t* row) {
  for (std::size_t i = begin; i < end; ++i) ++row[key_bucket(magnitude_key(values[i]))];
}

void collect_at_least(const float* values, std::size_t n, std::uint32_t threshold_key, int threads,
                      std::vector<std::uint32_t>& out) {
  collect_if(values, n, threads, [threshold_key](std::uint32_t key) { return key >= threshold_key; }, out);
}

void select_topk(const float* values, std::size_t n, std::size_t k, int threads, std::vector<std::uint32_t>& out,
                 KeyHistogram* histogram) {
  out.clear();
  if (k == 0 || n == 0) return;
  if (k >= n) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0u);
    return;
  }
  if (histogram == nullptr && n <= kDirectSelectMax) {
    select_topk_small(values, n, k, out);
    return;
  }
  KeyHistogram local;
  if (histogram == nullptr) {
    local.reset(n);
    parallel_chunks(n, kSelectChunk, threads, [&](std::size_t c, std::size_t begin, std::size_t end) {
      add_key_histogram(values, begin, end, local.row(c));
    });
    histogram = &local;
  }
  // Sum the rows (exact integers: the order does not matter), then walk down from the largest bucket.
  std::vector<std::uint64_t> total(kKeyBuckets, 0);
  for (std::size_t c = 0; c < histogram->chunks; ++c) {
    const std::uint32_t* row = histogram->row(c);
    for (std::size_t b = 0; b < kKeyBuckets; ++b) total[b] += row[b];
  }
  std::uint64_t above = 0;
  std::uint32_t bucket = kKeyBuckets - 1;
  for (;; --bucket) {
    if (above + total[bucket] >= k || bucket == 0) break;
    above += total[bucket];
  }
  const std::uint32_t bucket_floor = bucket << kKeyBucketShift;  // smallest key of bucket B
  std::vector<std::uint32_t> candidates;
  collect_at_least(values, n, bucket_floor, threads, candidates);
  select_among([values](std::uint32_t i) { return magnitude_key(values[i]); },
               std::span<const std::uint32_t>(candidates), k, out);
}

bool sampled_lower_bound(std::vector<std::uint32_t>& sample_keys, std::size_t n, std::size_t k,
                         std::uint32_t& threshold_key) {
  const std::size_t samples = sample_keys.size();
  if (n == 0 || k == 0 || k > n / 8 || samples == 0) return false;
  const double hits = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
  if (hits < 8.0) return false;
  const auto rank = static_cast<std::size_t>(std::ceil(1.05 * hits + 4.0 * std::sqrt(hits))) + 1;
  if (rank > samples) return false;
  auto nth = sample_keys.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(sample_keys.begin(), nth, sample_keys.end(), std::greater<std::uint32_t>());
  threshold_key = *nth;
  // Ties: if the sample key 3*rank further down still equals the bound, about 3x more elements than wanted would
  // become candidates (an all-zero tensor: all of them). The histogram select does not care.
  const std::size_t far = std::min(samples, 4 * rank);
  if (far > rank) {
    auto far_it = sample_keys.begin() + static_cast<std::ptrdiff_t>(far - 1);
    std::nth_element(nth + 1, far_it, sample_keys.end(), std::greater<std::uint32_t>());
    if (*far_it == threshold_key) return false;
  }
  return true;
}

void select_among_candidates(const Candidates& candidates, std::size_t k, std::vector<std::uint32_t>& out) {
  // Positions 0..size-1 ascend like the candidates' tensor indices, so select_among's tie rule (lower first) holds.
  std::vector<std::uint32_t> positions(candidates.size());
  std::iota(positions.begin(), positions.end(), 0u);
  select_among([&](std::uint32_t c) { return magnitude_key(candidates.value[c]); }, positions, k, out);
}

void concat_candidates(const std::vector<Candidates>& parts, Candidates& out) {
  std::size_t total = 0;
  for (const auto& part : parts) total += part.size();
  out.index.resize(total);
  out.value.resize(total);
  std::size_t at = 0;
  for (const auto& part : parts) {
    std::copy(part.index.begin(), part.index.end(), out.index.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(part.value.begin(), part.value.end(), out.value.begin() + static_cast<std::ptrdiff_t>(at));
    at += part.size();
  }
}

}  // namespace gradcomp::kernels
