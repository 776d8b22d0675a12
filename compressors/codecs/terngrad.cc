#include "compressors/codecs/terngrad.h"

#include <cmath>
#include <limits>
#include <vector>

#include "compressors/codecs/bucket_quantizer.h"

namespace gradcomp {
namespace {

constexpr unsigned kBits = 2;  // sign + one level: {-S, 0, +S}

std::vector<ParamSpec> terngrad_params() {
  return {
      ParamSpec{"clip", ParamSpec::Kind::kFloat, "2.5", 0, 1000, false, {},
                "clip |v| at clip * sigma of the bucket before ternarizing (0 = off; the paper uses 2.5)"},
      quantize::bucket_param("512", 0, "values per scale (a multiple of 8), or 0 for one scale per tensor"),
      quantize::seed_param(),
  };
}

// TernGrad's rules: scale max|v| clipped at clip * sigma; one level, by stochastic rounding.
struct TernGradPolicy : quantize::SignMagCodes<kBits> {
  static constexpr std::string_view kName = "terngrad";
  static constexpr bool kWholeTensor = true;
  static quantize::BucketLayout layout(const Params& params) { return terngrad_layout(params); }

  explicit TernGradPolicy(const Params& params)
      : SignMagCodes{kBits, static_cast<std::uint64_t>(params.get_int("seed"))},
        clip(static_cast<float>(params.get_float("clip"))) {}

  kernels::BucketStats stats(const float* g, const float* r, std::size_t n) const {
    return kernels::bucket_stats<kernels::kStatMax | kernels::kStatSq>(g, r, n);
  }

  // max|v|, clipped at clip * sigma, where sigma is the root mean square of the bucket (its standard deviation about
  // zero: gradients are near zero-mean, and unlike the centred deviation it never clips a constant bucket, e.g. a
  // 1-element tail, to 0, which would transmit nothing forever).
  float scale(const kernels::BucketStats& s, const float*, const float*, std::size_t n) const {
    float sigma = 0.0f;
    if (clip > 0.0f && n > 0) {
      sigma = static_cast<float>(std::sqrt(static_cast<double>(s.sum_sq) / static_cast<double>(n)));
      if (!std::isfinite(s.sum_sq)) sigma = std::numeric_limits<float>::max();  // overflowed: do not clip
    }
    return kernels::terngrad_scale(s.max_abs, sigma, clip);
  }

  float clip;
};

}  // namespace

quantize::BucketLayout terngrad_layout(const Params& params) {
  const auto bucket = static_cast<std::size_t>(params.get_int("bucket"));
  return {payload::CodecId::kTernGrad, TernGradPolicy::kName, kBits, bucket, static_cast<std::uint32_t>(bucket), kBits,
          "packed-code"};
}

CompressorInfo terngrad_compressor_info() {
  return quantize::bucket_quantizer_info<TernGradPolicy>(
      "TernGrad: per-bucket scale (clipped at clip*sigma) + stochastic ternary codes (Wen et al. 2017)",
      terngrad_params());
}

}  // namespace gradcomp
