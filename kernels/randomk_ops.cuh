// Random-k's positions in parallel: the exact set Floyd's algorithm picks (compressors/codecs/randomk.cc, randomk_indices),
// decided element by element, so the device computes it without a sequential pass and the host and the device agree
// bit for bit.
//
// Floyd draws, for steps j = n-k .. n-1 in order, t_j uniform in [0, j] (floyd_candidate) and inserts t_j, or j when
// t_j is already in the set. Hence, with every draw known up front (counter-based Philox):
//   - x < n-k is picked iff some step drew x (it can only enter as a draw, and its first draw always enters);
//   - a step value v >= n-k is picked iff t_v == v, or t_v was already in the set at step v (a collision), or a later
//     step drew v (the first such draw enters it when it is still out);
//   - u was in the set before step v (u < v) iff: u < n-k and u's first draw came before v; or u >= n-k and (t_u == u,
//     or a collision at step u, or a draw of u at a step in (u, v)). A collision at step u asks the same of t_u < u,
//     so the question walks down a chain of draws, which ends at a value below n-k or a decided case.
// The draws are looked up in `values` (every t, sorted ascending; equal values by step) with their `steps`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/host_device.cuh"
#include "kernels/philox_ops.cuh"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp::kernels {

// The draws of one random-k selection, sorted by value (stable: equal values in step order).
struct FloydDraws {
  const std::uint32_t* values = nullptr;  // k draws t, ascending
  const std::uint32_t* steps = nullptr;   // the step j of each
  std::uint64_t k = 0;
  std::uint64_t n = 0;
  PhiloxStream stream;  // the index stream (the tensor key salted with kRandomKStreamSalt)
};

inline constexpr std::uint64_t kNoStep = ~std::uint64_t{0};

// The stream of random-k's positions for (seed, tensor key, step).
GRADCOMP_HOST_DEVICE PhiloxStream randomk_stream(std::uint64_t seed, std::uint64_t tensor_key, std::uint64_t step) {
  return PhiloxStream::make(seed, tensor_key ^ kRandomKStreamSalt, step);
}

// First sorted entry whose value is >= x.
GRADCOMP_HOST_DEVICE std::uint64_t floyd_lower_bound(const FloydDraws& d, std::uint64_t x) {
  std::uint64_t lo = 0, hi = d.k;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (d.values[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The first step after `after` that drew x (kNoStep when none).
GRADCOMP_HOST_DEVICE std::uint64_t floyd_first_draw_after(const FloydDraws& d, std::uint64_t x, std::uint64_t after) {
  for (std::uint64_t i = floyd_lower_bound(d, x); i < d.k && d.values[i] == x; ++i) {
    if (d.steps[i] > after || after == kNoStep) return d.steps[i];
  }
  return kNoStep;
}

// t_j of step j (n-k <= j < n).
GRADCOMP_HOST_DEVICE std::uint64_t floyd_draw(const FloydDraws& d, std::uint64_t j) {
  return floyd_candidate(d.stream, d.n, d.k, j);
}

// Whether u was in the set before step v (u < v).
GRADCOMP_HOST_DEVICE bool floyd_in_before(const FloydDraws& d, std::uint64_t u, std::uint64_t v) {
  const std::uint64_t low = d.n - d.k;
  for (;;) {
    if (u < low) {
      const std::uint64_t first = floyd_first_draw_after(d, u, kNoStep);
      return first != kNoStep && first < v;
    }
    const std::uint64_t t = floyd_draw(d, u);
    if (t == u) return true;
    const std::uint64_t again = floyd_first_draw_after(d, u, u);
    if (again != kNoStep && again < v) return true;
    v = u;  // in iff a collision at step u: t was in before u
    u = t;
  }
}

// Whether step value v (n-k <= v < n) ends in the set.
GRADCOMP_HOST_DEVICE bool floyd_step_picked(const FloydDraws& d, std::uint64_t v) {
  const std::uint64_t t = floyd_draw(d, v);
  if (t == v) return true;
  if (floyd_first_draw_after(d, v, v) != kNoStep) return true;
  return floyd_in_before(d, t, v);
}

// Candidate c of 2k, in ascending order of the values it stands for: c < k is sorted draw c (picked when below n-k
// and the first of its value), c >= k is step n-k+(c-k). Writes the value to `item`; returns whether it is picked.
// The picked candidates, in order, are exactly randomk_indices(...).
GRADCOMP_HOST_DEVICE bool floyd_candidate_picked(const FloydDraws& d, std::uint64_t c, std::uint32_t& item) {
  if (c < d.k) {
    item = d.values[c];
    return d.values[c] < d.n - d.k && (c == 0 || d.values[c - 1] != d.values[c]);
  }
  const std::uint64_t v = d.n - d.k + (c - d.k);
  item = static_cast<std::uint32_t>(v);
  return floyd_step_picked(d, v);
}

}  // namespace gradcomp::kernels
