// Bucket reductions on the CPU with a fixed summation order, so results do not depend on threads or compiler and a
// CUDA kernel can reproduce them: 8 interleaved lanes (lane k sums elements i = k mod 8 in index order), combined as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The lane loops vectorize without -ffast-math.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace gradcomp::kernels {

inline constexpr std::size_t kReduceLanes = 8;

inline float combine_lanes(const float* lanes) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Statistics of v = g + r (r may be null) over n values.
struct BucketStats {
  float max_abs = 0.0f;   // max |v| over finite v
  float sum = 0.0f;       // sum v
  float sum_abs = 0.0f;   // sum |v|
  float sum_sq = 0.0f;    // sum v^2
  bool nonfinite = false; // some v is NaN or Inf
};

// What bucket_stats must compute (unused sums are skipped).
enum BucketStatMask : unsigned { kStatMax = 1, kStatSum = 2, kStatAbs = 4, kStatSq = 8 };

template <unsigned kMask>
inline BucketStats bucket_stats(const float* g, const float* r, std::size_t n) {
  float mx[kReduceLanes] = {}, s[kReduceLanes] = {}, sa[kReduceLanes] = {}, sq[kReduceLanes] = {};
  std::uint32_t bad[kReduceLanes] = {};
  const std::size_t full = n / kReduceLanes * kReduceLanes;
  auto visit = [&](std::size_t lane, float v) {
    const float a = std::fabs(v);
    bad[lane] |= !(a <= 3.40282347e38f);
    const float finite_a = a <= 3.40282347e38f ? a : 0.0f;
    if constexpr (kMask & kStatMax) mx[lane] = mx[lane] > finite_a ? mx[lane] : finite_a;
    if constexpr (kMask & kStatSum) s[lane] += v;
    if constexpr (kMask & kStatAbs) sa[lane] += a;
    if constexpr (kMask & kStatSq) sq[lane] += v * v;
  };
  if (r) {
    for (std::size_t i = 0; i < full; i += kReduceLanes) {
      for (std::size_t k = 0; k < kReduceLanes; ++k) visit(k, g[i + k] + r[i + k]);
    }
    for (std::size_t i = full; i < n; ++i) visit(i - full, g[i] + r[i]);
  } else {
    for (std::size_t i = 0; i < full; i += kReduceLanes) {
      for (std::size_t k = 0; k < kReduceLanes; ++k) visit(k, g[i + k]);
    }
    for (std::size_t i = full; i < n; ++i) visit(i - full, g[i]);
  }
  BucketStats stats;
  float m = 0.0f;
  std::uint32_t any_bad = 0;
  for (std::size_t k = 0; k < kReduceLanes; ++k) {
    m = m > mx[k] ? m : mx[k];
    any_bad |= bad[k];
  }
  stats.max_abs = m;
  stats.nonfinite = any_bad != 0;
  stats.sum = combine_lanes(s);
  stats.sum_abs = combine_lanes(sa);
  stats.sum_sq = combine_lanes(sq);
  return stats;
}

}  // namespace gradcomp::kernels
