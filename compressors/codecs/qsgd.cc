#include "compressors/codecs/qsgd.h"

#include <cmath>
#include <limits>
#include <vector>

#include "compressors/codecs/bucket_quantizer.h"

namespace gradcomp {
namespace {

enum class ScaleKind : std::uint32_t { kMax = 0, kL2 = 1 };

ScaleKind scale_kind(const Params& params) {
  return params.get_string("scale") == "l2" ? ScaleKind::kL2 : ScaleKind::kMax;
}

std::vector<ParamSpec> qsgd_params() {
  return {
      ParamSpec{"bits", ParamSpec::Kind::kInt, "4", 2, 8, false, {},
                "bits per value: a sign and 2^(bits-1)-1 levels (2 = ternary, 4 = 7 levels, 8 = 127 levels)"},
      quantize::bucket_param("512", 8, "values per scale (a multiple of 8)"),
      ParamSpec{"scale", ParamSpec::Kind::kChoice, "max", 0, 0, false, {"max", "l2"},
                "bucket scale: max|v| (lower variance) or the l2 norm (the paper's)"},
      quantize::seed_param(),
  };
}

// ||v||_2 of a bucket in double, for the rare bucket whose f32 sum of squares overflows; clamped to the f32 range.
float l2_norm_double(const float* g, const float* r, std::size_t n) {
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(r ? g[i] + r[i] : g[i]);
    sum += v * v;
  }
  const double norm = std::sqrt(sum);
  return norm > std::numeric_limits<float>::max() ? std::numeric_limits<float>::max() : static_cast<float>(norm);
}

// QSGD's rules: scale max|v| or ||v||_2 per bucket; levels by sign-magnitude stochastic rounding.
struct QsgdPolicy : quantize::SignMagCodes<> {
  static constexpr std::string_view kName = "qsgd";
  static constexpr bool kWholeTensor = false;
  static quantize::BucketLayout layout(const Params& params) { return qsgd_layout(params); }

  explicit QsgdPolicy(const Params& params)
      : SignMagCodes{layout(params).bits, static_cast<std::uint64_t>(params.get_int("seed"))},
        kind(scale_kind(params)) {}

  kernels::BucketStats stats(const float* g, const float* r, std::size_t n) const {
    if (kind == ScaleKind::kMax) return kernels::bucket_stats<kernels::kStatMax>(g, r, n);
    return kernels::bucket_stats<kernels::kStatMax | kernels::kStatSq>(g, r, n);
  }

  float scale(const kernels::BucketStats& s, const float* g, const float* r, std::size_t n) const {
    if (kind == ScaleKind::kMax) return s.max_abs;
    float scale = std::sqrt(s.sum_sq);
    if (!std::isfinite(scale)) scale = l2_norm_double(g, r, n);
    return scale > s.max_abs ? scale : s.max_abs;  // rounding must never put |v| above the scale
  }

  ScaleKind kind;
};

}  // namespace

quantize::BucketLayout qsgd_layout(const Params& params) {
  const auto bits = static_cast<unsigned>(params.get_int("bits"));
  const auto bucket = static_cast<std::size_t>(params.get_int("bucket"));
  return {payload::CodecId::kQsgd, QsgdPolicy::kName, bits, bucket,
          bits | (static_cast<std::uint32_t>(scale_kind(params)) << 8), static_cast<std::uint32_t>(bucket),
          "packed-level"};
}

CompressorInfo qsgd_compressor_info() {
  return quantize::bucket_quantizer_info<QsgdPolicy>(
      "QSGD: per-bucket scale + stochastically rounded sign/level codes (Alistarh et al. 2017)", qsgd_params());
}

}  // namespace gradcomp
