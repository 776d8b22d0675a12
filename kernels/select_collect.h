// Branch-free collection of (index, value) candidates whose magnitude key reaches a threshold, for the CPU passes of
// the sparsifiers (topk, dgc) that update a buffer and pick its large entries in the same pass. Host only.
//
// Hits are rare (about 1 % of elements) and scattered, so a branch per element would mispredict on most hits: with
// AVX2, 8 values are compared at once and their hits left-packed through a 256-entry permutation table into a small
// stack buffer, which is flushed to the chunk's vectors every kBlock entries. Candidates come out in ascending index
// order within a chunk; chunk parts are concatenated in chunk order by the caller, so the list never depends on the
// thread count.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/sparsify_ops.cuh"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp::kernels {

// Candidate entries: index[j] and value[j] belong together; indices ascend.
struct Candidates {
  std::vector<std::uint32_t> index;
  std::vector<float> value;
  std::size_t size() const { return index.size(); }
  void clear() {
    index.clear();
    value.clear();
  }
};

namespace detail {
// kLeftPack[mask] lists the positions of mask's set bits, lowest first, padded with 0.
constexpr std::array<std::array<std::uint32_t, 8>, 256> make_left_pack() {
  std::array<std::array<std::uint32_t, 8>, 256> table{};
  for (std::uint32_t mask = 0; mask < 256; ++mask) {
    std::uint32_t count = 0;
    for (std::uint32_t bit = 0; bit < 8; ++bit) {
      if (mask & (1u << bit)) table[mask][count++] = bit;
    }
  }
  return table;
}
alignas(32) inline constexpr std::array<std::array<std::uint32_t, 8>, 256> kLeftPack = make_left_pack();
}  // namespace detail

// Collects the entries of one chunk into `part` (appending). Use add8 / add1 in index order, then flush().
class CandidateCollector {
 public:
  // Entries with magnitude_key(value) >= threshold_key are kept.
  CandidateCollector(Candidates& part, std::uint32_t threshold_key) : part_(part), threshold_(threshold_key) {
#if defined(__AVX2__)
    // key >= t  <=>  key > t - 1 as signed int32 (keys are < 2^31; t = 0 gives -1, which every key exceeds).
    threshold_minus_1_ = _mm256_set1_epi32(static_cast<int>(threshold_key - 1u));
#endif
  }
  ~CandidateCollector() { flush(); }
  CandidateCollector(const CandidateCollector&) = delete;
  CandidateCollector& operator=(const CandidateCollector&) = delete;

#if defined(__AVX2__)
  // The 8 values of elements first .. first+7.
  void add8(__m256 values, std::uint32_t first) {
    const __m256i keys = _mm256_and_si256(_mm256_castps_si256(values), _mm256_set1_epi32(0x7FFFFFFF));
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, threshold_minus_1_)));
    if (mask == 0) return;  // the common case: no hit among the 8
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(detail::kLeftPack[mask].data()));
    const __m256i index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(index_ + count_), _mm256_permutevar8x32_epi32(index, perm));
    _mm256_storeu_ps(value_ + count_, _mm256_permutevar8x32_ps(values, perm));
    count_ += static_cast<std::size_t>(__builtin_popcount(static_cast<unsigned>(mask)));
    if (count_ > kBlock) flush();
  }
#endif

  // One value of element i.
  void add1(float value, std::uint32_t i) {
    index_[count_] = i;
    value_[count_] = value;
    count_ += magnitude_key(value) >= threshold_ ? 1 : 0;
    if (count_ > kBlock) flush();
  }

  void flush() {
    part_.index.insert(part_.index.end(), index_, index_ + count_);
    part_.value.insert(part_.value.end(), value_, value_ + count_);
    count_ = 0;
  }

 private:
  static constexpr std::size_t kBlock = 512;  // flush when more than this many are buffered (8 slots of headroom)
  Candidates& part_;
  std::uint32_t threshold_;
#if defined(__AVX2__)
  __m256i threshold_minus_1_;
#endif
  std::size_t count_ = 0;
  std::uint32_t index_[kBlock + 8];
  float value_[kBlock + 8];
};

}  // namespace gradcomp::kernels
