// Bucket reductions on the CPU with a fixed summation order, so results do not depend on threads or compiler and a
// CUDA kernel can reproduce them: 8 interleaved lanes (lane k sums elements i = k mod 8 in index order), combined as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The lane loops vectorize without -ffast-math.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

namespace detail {

template <unsigned kMask>
inline BucketStats bucket_stats_exact(const float* g, const float* r, std::size_t n) {
  float mx[kReduceLanes] = {}, s[kReduceLanes] = {}, sa[kReduceLanes] = {}, sq[kReduceLanes] = {};
  std::uint32_t bad[kReduceLanes] = {};
  std::size_t full = 0;
#if defined(__AVX2__)
  {  // lane k of each vector is element i = k mod 8: the same order as the scalar loop below
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 big = _mm256_set1_ps(3.40282347e38f);
    __m256 vmx = _mm256_setzero_ps(), vs = vmx, vsa = vmx, vsq = vmx, vbad = vmx;
    for (; full + kReduceLanes <= n; full += kReduceLanes) {
      __m256 v = _mm256_loadu_ps(g + full);
      if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + full));
      const __m256 a = _mm256_and_ps(v, abs_mask);
      const __m256 finite = _mm256_cmp_ps(a, big, _CMP_LE_OQ);
      vbad = _mm256_or_ps(vbad, _mm256_andnot_ps(finite, _mm256_castsi256_ps(_mm256_set1_epi32(-1))));
      if constexpr (kMask & kStatMax) vmx = _mm256_max_ps(vmx, _mm256_and_ps(a, finite));
      if constexpr (kMask & kStatSum) vs = _mm256_add_ps(vs, v);
      if constexpr (kMask & kStatAbs) vsa = _mm256_add_ps(vsa, a);
      if constexpr (kMask & kStatSq) vsq = _mm256_add_ps(vsq, _mm256_mul_ps(v, v));
    }
    _mm256_storeu_ps(mx, vmx);
    _mm256_storeu_ps(s, vs);
    _mm256_storeu_ps(sa, vsa);
    _mm256_storeu_ps(sq, vsq);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bad), _mm256_castps_si256(vbad));
  }
#endif
  auto visit = [&](std::size_t lane, float v) {
    const float a = std::fabs(v);
    bad[lane] |= a <= 3.40282347e38f ? 0u : 1u;
    const float finite_a = a <= 3.40282347e38f ? a : 0.0f;
    if constexpr (kMask & kStatMax) mx[lane] = mx[lane] > finite_a ? mx[lane] : finite_a;
    if constexpr (kMask & kStatSum) s[lane] += v;
    if constexpr (kMask & kStatAbs) sa[lane] += a;
    if constexpr (kMask & kStatSq) sq[lane] += v * v;
  };
  if (r) {
    for (; full + kReduceLanes <= n; full += kReduceLanes) {
      for (std::size_t k = 0; k < kReduceLanes; ++k) visit(k, g[full + k] + r[full + k]);
    }
    for (std::size_t i = full; i < n; ++i) visit(i - full, g[i] + r[i]);
  } else {
    for (; full + kReduceLanes <= n; full += kReduceLanes) {
      for (std::size_t k = 0; k < kReduceLanes; ++k) visit(k, g[full + k]);
    }
    for (std::size_t i = full; i < n; ++i) visit(i - full, g[i]);
  }
  BucketStats stats;
  float m = 0.0f;
  std::uint32_t any_bad = 0;
  for (std::size_t k = 0; k < kReduceLanes; ++k) {
    m = m > mx[k] ? m : mx[k];
    any_bad |= bad[k];  // AVX2 lanes hold all-ones, scalar ones hold 1
  }
  stats.max_abs = m;
  stats.nonfinite = any_bad != 0;
  stats.sum = combine_lanes(s);
  stats.sum_abs = combine_lanes(sa);
  stats.sum_sq = combine_lanes(sq);
  return stats;
}

#if defined(__AVX2__)
// max|v| and sum v^2 with the max taken over the bit patterns of |v|: for non-negative floats the integer order is
// the float order, and Inf/NaN patterns are above every finite one, so one integer max per vector gives both the
// maximum and the non-finite flag. Returns false (stats unset) when some v is non-finite; the caller then uses the
// exact loop, which excludes non-finite values from the maximum. Same lanes and summation order as the exact loop.
template <unsigned kMask>
inline bool bucket_max_sq_finite(const float* g, const float* r, std::size_t n, BucketStats& stats) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256i vmx = _mm256_setzero_si256();
  __m256 vsq = _mm256_setzero_ps();
  std::size_t full = 0;
  for (; full + kReduceLanes <= n; full += kReduceLanes) {
    __m256 v = _mm256_loadu_ps(g + full);
    if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + full));
    vmx = _mm256_max_epi32(vmx, _mm256_castps_si256(_mm256_and_ps(v, abs_mask)));
    if constexpr (kMask & kStatSq) vsq = _mm256_add_ps(vsq, _mm256_mul_ps(v, v));
  }
  std::uint32_t mx[kReduceLanes];
  float sq[kReduceLanes];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(mx), vmx);
  _mm256_storeu_ps(sq, vsq);
  for (std::size_t i = full; i < n; ++i) {
    const float v = r ? g[i] + r[i] : g[i];
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bits &= 0x7FFFFFFFu;
    mx[i - full] = mx[i - full] > bits ? mx[i - full] : bits;
    if constexpr (kMask & kStatSq) sq[i - full] += v * v;
  }
  std::uint32_t m = 0;
  for (std::size_t k = 0; k < kReduceLanes; ++k) m = m > mx[k] ? m : mx[k];
  if (m >= 0x7F800000u) return false;
  std::memcpy(&stats.max_abs, &m, sizeof(m));
  stats.sum_sq = combine_lanes(sq);
  return true;
}
#endif

}  // namespace detail

// Statistics `kMask` of v = g + r (r may be null) over n values.
template <unsigned kMask>
inline BucketStats bucket_stats(const float* g, const float* r, std::size_t n) {
#if defined(__AVX2__)
  if constexpr ((kMask & (kStatSum | kStatAbs)) == 0) {
    BucketStats stats;
    if (detail::bucket_max_sq_finite<kMask>(g, r, n, stats)) return stats;
  }
#endif
  return detail::bucket_stats_exact<kMask>(g, r, n);
}

// Whether some of x[0, n) is Inf or NaN (exponent bits all ones; branch-free, so it vectorizes).
inline bool any_nonfinite(const float* x, std::size_t n) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bad |= (bits & 0x7F800000u) == 0x7F800000u;
  }
  return bad != 0;
}

// Non-finite gradient values in g[begin, end): adds their count to `count` and lowers `first` to the smallest such
// index. The fused codecs call it only for a bucket whose v = g + r was flagged non-finite (a non-finite g always
// makes v non-finite, whatever r holds), so the common all-finite case costs nothing beyond the bucket statistics.
inline void count_nonfinite_range(const float* g, std::size_t begin, std::size_t end, std::size_t& count,
                                  std::size_t& first) {
  for (std::size_t i = begin; i < end; ++i) {
    if (!std::isfinite(g[i])) {
      first = i < first ? i : first;
      ++count;
    }
  }
}

}  // namespace gradcomp::kernels
