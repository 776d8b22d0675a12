// Per-element math of the sparsifying codecs (topk, randomk, blocktopk, dgc), shared by the CPU loops
// (compressors/codecs/topk_select.cc, compressors/*.cc) and the CUDA kernels: one truth for both.
//
// Selection order. Every sparsifier ranks elements by a 32-bit *magnitude key*: the IEEE bits of |x| (sign cleared).
// For non-NaN floats this order equals the order of |x|; NaN (only reachable with nonfinite=pass) ranks above +inf,
// so the order is total and the selection well defined. Ties (equal keys) are broken by the LOWER index: element i
// ranks before element j when key_i > key_j, or key_i == key_j and i < j. The same rule ranks blocks by their norm key.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/half_ops.cuh"
#include "kernels/host_device.cuh"
#include "kernels/philox_ops.cuh"
#include "kernels/wire_nan.cuh"

namespace gradcomp::kernels {

// Magnitude key of one value: bits of |x|. Monotone in |x|; every NaN is the one key 0x7FFFFFFF, above inf, so NaNs
// tie and rank by index: the NaN that arithmetic returns differs by machine (x86 keeps the input's payload, NVIDIA
// GPUs return 0x7FFFFFFF; kernels/wire_nan.cuh), and its payload must not decide which block or element is sent.
// Idempotent: the key of a key's float bits is that key.
GRADCOMP_HOST_DEVICE std::uint32_t magnitude_key(float value) {
  const std::uint32_t magnitude = float_bits(value) & 0x7FFFFFFFu;
  return magnitude > 0x7F800000u ? 0x7FFFFFFFu : magnitude;
}

// Radix bucket of a magnitude key for the first select pass: its top 16 of 31 bits (exponent + 7 mantissa bits).
inline constexpr int kKeyBucketShift = 15;
inline constexpr std::uint32_t kKeyBuckets = 1u << 16;
GRADCOMP_HOST_DEVICE std::uint32_t key_bucket(std::uint32_t key) { return key >> kKeyBucketShift; }

// True when (key_a, index_a) ranks strictly before (key_b, index_b): larger key first, lower index on ties.
GRADCOMP_HOST_DEVICE bool ranks_before(std::uint32_t key_a, std::uint64_t index_a, std::uint32_t key_b,
                                       std::uint64_t index_b) {
  return key_a > key_b || (key_a == key_b && index_a < index_b);
}

// k of a ratio: max(1, round(ratio * n)) clamped to n; 0 for an empty tensor.
GRADCOMP_HOST_DEVICE std::uint64_t k_of_ratio(double ratio, std::uint64_t n) {
  if (n == 0) return 0;
  const double exact = ratio * static_cast<double>(n) + 0.5;
  std::uint64_t k = exact >= static_cast<double>(n) ? n : static_cast<std::uint64_t>(exact);
  if (k < 1) k = 1;
  return k;
}

// Uniform integer in [0, bound) from 64 random bits (Lemire's multiply-shift; bias < bound / 2^64, negligible for
// every tensor size). bound must be > 0.
GRADCOMP_HOST_DEVICE std::uint64_t uniform_below(std::uint64_t bits, std::uint64_t bound) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(bits, bound);
#else
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(bits) * bound) >> 64);
#endif
}

// Uniform integer in [0, bound) from 32 random bits (multiply-shift); bound <= 2^32.
GRADCOMP_HOST_DEVICE std::uint64_t uniform_below32(std::uint32_t bits, std::uint64_t bound) {
  return (static_cast<std::uint64_t>(bits) * bound) >> 32;
}

// 64 random bits of draw `j` of a stream (draw j uses the lanes 2(j mod 2), 2(j mod 2)+1 of Philox block j/2).
GRADCOMP_HOST_DEVICE std::uint64_t philox_bits64(const PhiloxStream& stream, std::uint64_t j) {
  const Philox4 block = stream.block(j >> 1);
  const int lane = static_cast<int>(j & 1) * 2;
  return (static_cast<std::uint64_t>(block.v[lane]) << 32) | block.v[lane + 1];
}

// Random-k: the tensor key namespace of the index stream, so it never collides with other codecs' streams of the
// same (seed, tensor, step).
inline constexpr std::uint64_t kRandomKStreamSalt = 0x72616e646f6d6bull;  // "randomk"
// DGC: stream of the threshold sample positions.
inline constexpr std::uint64_t kDgcSampleStreamSalt = 0x6467632d73616dull;  // "dgc-sam"

// Random-k, Floyd's algorithm step j (j = n-k .. n-1): the candidate drawn in [0, j].
GRADCOMP_HOST_DEVICE std::uint64_t floyd_candidate(const PhiloxStream& stream, std::uint64_t n, std::uint64_t k,
                                                   std::uint64_t j) {
  return uniform_below(philox_bits64(stream, j - (n - k)), j + 1);
}

// Error feedback of one element: v = residual + grad (f32, the same rounding on every path).
GRADCOMP_HOST_DEVICE float ef_accumulate(float residual, float grad) { return residual + grad; }

// Top-k value on the wire as f16 bits, saturated to +-65504 (never inf for finite input); any NaN becomes the wire
// NaN 0x7E00 (kernels/wire_nan.cuh). `saturated` is set when the value was clamped.
GRADCOMP_HOST_DEVICE std::uint16_t sparse_value_to_half(float value, bool& saturated) {
  saturated = false;
  if (is_nan_bits(value)) return kWireNanF16;
  if (value > kHalfMax) {
    saturated = true;
    value = kHalfMax;
  } else if (value < -kHalfMax) {
    saturated = true;
    value = -kHalfMax;
  }
  return float_to_half_bits(value);
}

// DGC momentum correction of one element (Lin et al. 2018, Alg. 1 with the official implementation's Nesterov form):
//   plain:    u = m*u + g;      v += u
//   nesterov: u = m*(u + g);    v += u + g
// m*u + g is one explicit fused multiply-add, so the result does not depend on whether a compiler contracts it
// (GCC does by default for C++, nvcc too): CPU and GPU give the same bits.
GRADCOMP_HOST_DEVICE void dgc_accumulate(float grad, float momentum, bool nesterov, float& u, float& v) {
  if (nesterov) {
    u = momentum * (u + grad);
    v = v + (u + grad);
  } else {
    u = fmaf(momentum, u, grad);
    v = v + u;
  }
}

// One step of a block's squared L2 norm: sum + x*x as an explicit fused multiply-add (same bits on CPU and GPU).
GRADCOMP_HOST_DEVICE float block_norm_step(float sum, float x) { return fmaf(x, x, sum); }

// DGC warm-up density of `step`: stage s = step / warmup_steps uses 0.25 / 4^s for s < 4 (25%, 6.25%, 1.5625%,
// 0.390625%), then `ratio`. Never sparser than `ratio`. warmup_steps == 0 disables the warm-up.
GRADCOMP_HOST_DEVICE double dgc_density(std::uint64_t step, std::uint64_t warmup_steps, double ratio) {
  if (warmup_steps == 0) return ratio;
  const std::uint64_t stage = step / warmup_steps;
  if (stage >= 4) return ratio;
  double density = 0.25;
  for (std::uint64_t s = 0; s < stage; ++s) density *= 0.25;
  return density > ratio ? density : ratio;
}

}  // namespace gradcomp::kernels
