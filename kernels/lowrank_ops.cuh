// Per-element math of PowerSGD's LowRankOps (compressors/codecs/lowrank_ops.h), identical on host and device: the host loops
// (compressors/codecs/lowrank_ops_cpu.cc) and the CUDA kernels (kernels/lowrank_cuda.cu) both call these functions, so the
// element-wise operations give the same bits in both spaces (both sides are compiled without FMA contraction, see
// CMakeLists.txt). The matrix products other than k == 1 (BLAS, cuBLAS) and the Gram-Schmidt variants are not
// element math and differ within rounding (kernels/lowrank_cuda.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/half_ops.cuh"
#include "kernels/host_device.cuh"
#include "kernels/philox_ops.cuh"

namespace gradcomp::kernels {

// Element type of a tensor that store_f32 writes (the values of gradcomp::DType for f32, f16 and bf16).
enum class LowRankDType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// One stored element of D: a float, or the 16 bits of an f16/bf16.
template <LowRankDType D>
using LowRankElement = std::conditional_t<D == LowRankDType::kF32, float, std::uint16_t>;

// store_f32 at one element: s * value (rounded to float), plus the element's old value read as float when
// `accumulate` (out is read only then), rounded once to D (round to nearest even, kernels/half_ops.cuh).
template <LowRankDType D>
GRADCOMP_HOST_DEVICE void lowrank_store(LowRankElement<D>& out, float value, float s, bool accumulate) {
  const float v = s * value;
  if constexpr (D == LowRankDType::kF32) {
    out = accumulate ? out + v : v;
  } else if constexpr (D == LowRankDType::kF16) {
    out = float_to_half_bits(accumulate ? half_bits_to_float(out) + v : v);
  } else {
    out = float_to_bf16_bits(accumulate ? bf16_bits_to_float(out) + v : v);
  }
}

// fill_random's value from the Philox bits of its element: uniform01(bits) - 0.5, in [-0.5, 0.5).
GRADCOMP_HOST_DEVICE float lowrank_random(std::uint32_t bits) { return uniform01(bits) - 0.5f; }

// The k == 1 matrix product C = alpha x y^T + beta C, one element: C_ij = xi * yj when beta is 0 (C's old value is
// not read: NaN there is ignored), else beta * C_ij + xi * yj; xi = lowrank_outer_row(alpha, x_i), once per row.
// Callers choose between the two by beta once per call (a loop with the choice inside does not vectorize).
GRADCOMP_HOST_DEVICE float lowrank_outer_row(float alpha, float x) { return alpha * x; }
GRADCOMP_HOST_DEVICE float lowrank_outer(float xi, float yj) { return xi * yj; }
GRADCOMP_HOST_DEVICE float lowrank_outer(float xi, float yj, float beta, float c) { return beta * c + xi * yj; }

// True for NaN and +-Inf (all exponent bits set): the test of count_nonfinite and zero_nonfinite. Branch-free on
// the bits, so host loops over it vectorize.
GRADCOMP_HOST_DEVICE bool lowrank_nonfinite(float x) { return (float_bits(x) & 0x7F800000u) == 0x7F800000u; }

}  // namespace gradcomp::kernels
