// The spec list, the test data and the tolerance rules shared by the two halves of the CPU/GPU parity check:
// tests/gpu/codec_parity_gpu_test.cc (label gpu: the GPU must reproduce the CPU bit for bit) and
// tests/compressors/codec_parity_reference_test.cc (label cpu: the CPU half of every GPU test, so a bug in the test's
// data or invariants shows on any machine instead of waiting for a GPU). Header-only, no CUDA.
#pragma once

#include <gtest/gtest.h>

#include <cctype>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gradcomp/tensor.h"

namespace gradcomp::parity {

// Specs whose CUDA path must match the CPU bit for bit: the dense codecs here, every later backend in
// tests/gpu/parity_specs.inc.
inline const std::vector<std::string>& specs() {
  static const std::vector<std::string> list = {
      "none",
      "fp16",
      "fp16:prescale=0.25",
      "fp16:ef=off",
      "bf16",
      "bf16:ef=off",
#include "tests/gpu/parity_specs.inc"
  };
  return list;
}

// `spec` with one more parameter ("topk" + "nonfinite=pass" -> "topk:nonfinite=pass").
inline std::string with_param(const std::string& spec, const std::string& param) {
  return spec + (spec.find(':') == std::string::npos ? ":" : ",") + param;
}

// Tensor sizes of the multi-step parity check: 1 and 7 (shorter than one vector / one warp tile), 4096, 100003 (a
// prime: ragged last bucket, block and chunk), and kGridStrideSize.
// kGridStrideSize: large enough that every grid-stride loop over elements, 4-element groups or 512-value buckets
// runs at least twice per thread / warp on the largest GPU expected (grid_for caps a grid at 8 blocks of 256 threads
// per SM; an H200 has 132 SMs: 270,336 threads, 8,448 warps; 4.5M values are 1.1M float4 groups and 8,790 buckets
// of 512), and that DGC samples more than its 1,024-draw minimum (69 chunks of 64K, 656 draws each).
// GRADCOMP_PARITY_MAX_NUMEL=N keeps the sizes up to N (compute-sanitizer runs, where every kernel is many times
// slower: bench/gpu/check.sh).
inline constexpr std::size_t kGridStrideSize = 4'500'007;
inline const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> list = [] {
    std::vector<std::size_t> all = {1, 7, 4096, 100003, kGridStrideSize};
    if (const char* limit = std::getenv("GRADCOMP_PARITY_MAX_NUMEL")) {
      const std::size_t max = std::strtoull(limit, nullptr, 10);
      std::erase_if(all, [&](std::size_t n) { return n > max; });
    }
    return all;
  }();
  return list;
}

// Gradient-like values: normal(0, scale), with exact zeros / negative zeros every 1009th element from 5 and
// +-`outlier` every 997th element (fp16 saturation, and buckets whose statistics are dominated by one value). The
// default 1e5 is beyond f16's range: use half_outlier() for data that is stored as an f16 tensor.
inline std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f, float outlier = 1e5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (auto& v : values) v = normal(rng);
  for (std::size_t i = 0; i < n; i += 997) values[i] = (i % 2 ? -1.0f : 1.0f) * outlier;
  for (std::size_t i = 5; i < n; i += 1009) values[i] = (i % 2 ? -0.0f : 0.0f);
  return values;
}

// Seed of the data of one (size, step) of the multi-step parity check. Both tests draw n + 1 values with it and
// compress the view [offset, offset + n), offset 0 or 1 (1: a view that is not 16-byte aligned).
inline unsigned step_seed(std::size_t n, std::uint64_t step) { return static_cast<unsigned>(step * 31 + n); }

// Puts the non-finite values of the nonfinite=... checks into `values` (at least 4001 of them) and returns how many:
// a default quiet NaN, -inf, and a negative NaN with a payload (x86 arithmetic keeps such bits, a GPU returns
// 0x7FFFFFFF: the payload must hold the one wire NaN of kernels/wire_nan.cuh either way).
inline std::size_t put_nonfinite(std::vector<float>& values) {
  values[123] = std::nanf("");
  values[4000] = -std::numeric_limits<float>::infinity();
  const std::uint32_t negative_payload_nan = 0xFFC01234u;
  std::memcpy(&values[2000], &negative_payload_nan, sizeof(float));
  return 3;
}

// The outlier for tensors stored in f16 / bf16: finite in both formats (f16's largest is 65504), exactly
// representable in both, and still far above the normal(0, 0.1) bulk.
inline constexpr float kHalfOutlier = 30720.0f;  // 15 * 2^11: 4 significant bits

// Values whose f32 statistics overflow although every value is finite: a run of 64 values of +-2e37 starting at
// `start` (bucket-aligned for buckets that divide 64 * k). Their sum of squares (and for 64 of them the sum of
// |v|) exceeds FLT_MAX, so qsgd's l2 scale, terngrad's sigma and onebit's mean fall back to double-precision sums.
inline std::vector<float> overflow_values(std::size_t n, unsigned seed, std::size_t start = 512) {
  auto values = random_values(n, seed);
  for (std::size_t i = start; i < n && i < start + 64; ++i) values[i] = (i % 3 ? 2e37f : -2e37f);
  return values;
}

// The wire scale a codec applies to the values it decodes: fp16's own prescale=... when the spec sets it, else
// the context's prescale (dense codecs, sparsifiers and quantizers multiply by ctx.prescale before encoding).
inline float wire_scale(const std::string& spec, float context_prescale) {
  const auto at = spec.find("prescale=");
  if (at == std::string::npos) return context_prescale;
  return std::stof(spec.substr(at + 9));
}

// Error-feedback invariant per element: residual_after + decoded / wire_scale == residual_before + grad, computed
// in f32. The codec computes v = grad + residual_before (the same rounding as the right-hand side) and
// residual_after = v - sent; adding `sent` back rounds once more. Each rounding errs by at most half an ulp of its
// result, so the difference is bounded by eps * (|residual_after| + |sent| + |v|): a cancellation near a large
// outlier (|sent| ~ 1e5 while v ~ 1) must not fail the check, while a residual that misses what was sent (an error of
// |sent|, or of a whole quantization step) always does. `sent` is decoded / wire_scale.
inline float ef_tolerance(float residual_after, float sent, float v) {
  constexpr float eps = std::numeric_limits<float>::epsilon();
  return 2.0f * eps * (std::fabs(residual_after) + std::fabs(sent) + std::fabs(v)) +
         std::numeric_limits<float>::denorm_min();
}

// A gtest-safe name for a spec parameter ("topk:k=5,values=f16" -> "topk_k_5_values_f16").
inline std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

}  // namespace gradcomp::parity
