// Per-element error bounds of sums computed in a given precision, derived from how they are computed (for the
// allreduce tests and the perf tools' #wrong column). Each element gets its own bound, in units of its own terms'
// magnitude, so a wrong small element is caught as surely as a wrong large one.
//
// A sum of n terms added in any order (ring, tree, rank order), each addition rounded to nearest in a format with unit
// roundoff u, is off from the exact sum by at most gamma_{n-1} * sum_r |x_r|, gamma_k = k u / (1 - k u) (Higham,
// "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 4.4). Below the normal range a rounding errs by at
// most half the smallest subnormal instead, so each rounding also adds that.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/tensor.h"

namespace gradcomp::testing {

// Unit roundoff of a floating-point wire dtype: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16).
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// The smallest positive subnormal: 2^-149 (f32, bf16), 2^-24 (f16).
inline double smallest_subnormal(DType dtype) { return std::ldexp(1.0, dtype == DType::kF16 ? -24 : -149); }

// Bound on |computed - exact| for the sum of `terms` values whose absolute values add up to `magnitude`, each
// addition rounded to `dtype`. With `rounded_inputs`, the terms themselves were rounded to `dtype` from the values
// the bound is against (one more rounding each).
inline double sum_error_bound(DType dtype, int terms, double magnitude, bool rounded_inputs = false) {
  const double u = unit_roundoff(dtype);
  const int roundings = std::max(terms - 1, 0);
  double bound = roundings * u / (1.0 - roundings * u) * magnitude + roundings * smallest_subnormal(dtype) / 2;
  if (rounded_inputs) bound += u * magnitude + terms * smallest_subnormal(dtype) / 2;
  return bound;
}

// The bound of each element of a dense allreduce: the sum over `ranks` in the wire dtype, compared with a reference
// summed in f32 from the same transmitted values (`magnitude[i]`: sum over ranks of |term i|).
inline std::vector<double> dense_sum_bounds(DType wire, int ranks, std::span<const double> magnitude) {
  std::vector<double> bounds(magnitude.size());
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    bounds[i] = sum_error_bound(wire, ranks, magnitude[i]) + sum_error_bound(DType::kF32, ranks, magnitude[i]);
  }
  return bounds;
}

// The tolerance of each element of an allreduce against its reference (tests/comm/flat_reference.h): for a dense sum,
// per element from its terms' magnitudes (the wire dtype's additions plus the reference's f32 ones); for the
// algorithms that decode and add in f32 (allgather, sparse, sra), 1e-5 * n of the reference's largest magnitude.
inline std::vector<double> element_bounds(std::span<const float> ref, std::span<const double> magnitude,
                                          AllreduceAlgorithm algorithm, DType wire, int ranks) {
  if (algorithm == AllreduceAlgorithm::kDense) return dense_sum_bounds(wire, ranks, magnitude);
  double scale = 0;
  for (float v : ref) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  return std::vector<double>(ref.size(), 1e-5 * ranks * scale + 1e-30);
}

// Elements outside their bound (NaN counts as outside); `max_error` gets the largest |got - want|.
inline std::size_t count_outside(std::span<const float> got, std::span<const float> want, std::span<const double> bounds,
                                 double* max_error = nullptr) {
  std::size_t outside = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, error);
    if (!(error <= bounds[i])) ++outside;
  }
  if (max_error != nullptr) *max_error = worst;
  return outside;
}

}  // namespace gradcomp::testing
