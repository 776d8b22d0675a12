// Template part of kernels/topk_select.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace gradcomp::kernels {

template <typename KeyOf>
void select_among(KeyOf key_of, std::span<const std::uint32_t> candidates, std::size_t k,
                  std::vector<std::uint32_t>& out) {
  out.clear();
  if (k == 0) return;
  if (k >= candidates.size()) {
    out.assign(candidates.begin(), candidates.end());
    return;
  }
  std::vector<std::uint32_t> keys(candidates.size());
  for (std::size_t c = 0; c < candidates.size(); ++c) keys[c] = key_of(candidates[c]);
  std::vector<std::uint32_t> scratch = keys;
  // k-th largest key (position k-1 in descending order).
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch.end(),
                   std::greater<std::uint32_t>());
  const std::uint32_t threshold = scratch[k - 1];
  std::size_t greater = 0;
  for (const std::uint32_t key : keys) greater += key > threshold;
  std::size_t take_equal = k - greater;  // >= 1: the threshold itself is among the k best
  out.reserve(k);
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    if (keys[c] > threshold) {
      out.push_back(candidates[c]);
    } else if (keys[c] == threshold && take_equal > 0) {
      out.push_back(candidates[c]);  // candidates ascend, so ties go to the lower index
      --take_equal;
    }
  }
}

}  // namespace gradcomp::kernels
