#include "compressors/qsgd.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "compressors/error_feedback.h"
#include "compressors/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/bucket_reduce.h"
#include "kernels/cpu_parallel.h"
#include "kernels/signmag_cpu.h"
#include "kernels/stream_store.h"

namespace gradcomp {
namespace {

enum class ScaleKind : std::uint32_t { kMax = 0, kL2 = 1 };

std::vector<ParamSpec> qsgd_params() {
  std::vector<ParamSpec> params = {
      ParamSpec{"bits", ParamSpec::Kind::kInt, "4", 2, 8, false, {},
                "bits per value: a sign and 2^(bits-1)-1 levels (2 = ternary, 4 = 7 levels, 8 = 127 levels)"},
      quantize::bucket_param("512", 8, "values per scale (a multiple of 8)"),
      ParamSpec{"scale", ParamSpec::Kind::kChoice, "max", 0, 0, false, {"max", "l2"},
                "bucket scale: max|v| (lower variance) or the l2 norm (the paper's)"},
      quantize::seed_param(),
  };
  for (auto& common : lossy_common_params()) params.push_back(std::move(common));
  return params;
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

class QsgdCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit QsgdCompressor(const Params& params)
      : ErrorFeedbackCompressor("qsgd", payload::CodecId::kQsgd, qsgd_compressor_info().traits, qsgd_params(), params),
        bits_(static_cast<unsigned>(params.get_int("bits"))),
        bucket_(static_cast<std::size_t>(params.get_int("bucket"))),
        scale_(params.get_string("scale") == "l2" ? ScaleKind::kL2 : ScaleKind::kMax),
        seed_(static_cast<std::uint64_t>(params.get_int("seed"))) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    return payload::total_bytes(header_for(numel, DType::kF32));
  }

 protected:
  // The bucket statistics already flag non-finite values, so the base's separate scan is folded into encode().
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    payload::Header header = header_for(n, args.original_dtype);
    GRADCOMP_CHECK(out.size() >= payload::total_bytes(header), "qsgd: output buffer of {} bytes is too small ({})",
                   out.size(), payload::total_bytes(header));
    std::byte* scales = out.data() + payload::section_offset(header, 0);
    auto* packed = reinterpret_cast<std::uint8_t*>(out.data() + payload::section_offset(header, 1));
    const auto stream = kernels::PhiloxStream::make(seed_, args.tensor_key, args.ctx->step);
    const float prescale = args.ctx->prescale;
    const std::size_t chunk = quantize::bucket_chunk(bucket_);
    const std::size_t chunks = (n + chunk - 1) / chunk;
    std::vector<std::uint8_t> bad(chunks, 0);
    std::vector<std::size_t> bad_count(chunks, 0), bad_first(chunks, n);
    float* r_out = args.residual_out ? args.residual_out : args.residual;
    const bool stream_out = args.residual_out && kernels::use_stream_stores(r_out, n, false);
    const kernels::SignMagQuantizer quantizer(bits_, stream);
    kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
      for (std::size_t b0 = begin; b0 < end; b0 += bucket_) {
        const std::size_t b1 = std::min(end, b0 + bucket_);
        const float* g = args.grad + b0;
        const float* r = args.residual ? args.residual + b0 : nullptr;
        float scale = 0.0f;
        bool nonfinite = false;
        if (scale_ == ScaleKind::kMax) {
          const auto s = kernels::bucket_stats<kernels::kStatMax>(g, r, b1 - b0);
          scale = s.max_abs;
          nonfinite = s.nonfinite;
        } else {
          const auto s = kernels::bucket_stats<kernels::kStatMax | kernels::kStatSq>(g, r, b1 - b0);
          nonfinite = s.nonfinite;
          scale = std::sqrt(s.sum_sq);
          if (!std::isfinite(scale)) scale = l2_norm_double(g, r, b1 - b0);
          scale = scale > s.max_abs ? scale : s.max_abs;  // rounding must never put |v| above the scale
        }
        float wire = scale * prescale;
        if (nonfinite) {
          // v = g + r is non-finite somewhere (a non-finite g always makes it so): count the gradient's own.
          wire = std::numeric_limits<float>::quiet_NaN();
          bad[k] = 1;
          kernels::count_nonfinite_range(args.grad, b0, b1, bad_count[k], bad_first[k]);
          kernels::signmag_nonfinite_range(args.grad, args.residual, r_out, b0, b1, bits_, packed);
        } else {
          quantizer.quantize(args.grad, args.residual, r_out, b0, b1, scale, packed, stream_out);
        }
        std::memcpy(scales + (b0 / bucket_) * sizeof(float), &wire, sizeof(float));
      }
      kernels::stream_fence(stream_out);
    });
    for (const auto flag : bad) header.flags |= flag ? quantize::kFlagNonFinite : 0;
    const auto tally = quantize::combine_nonfinite(bad_count, bad_first, n);
    stats.nonfinite = tally.count;
    if (args.first_nonfinite) *args.first_nonfinite = tally.first;
    stats.selected = n;
    return payload::write_header(header, out);
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    const payload::Header expected = header_for(numel, DType::kF32);
    quantize::check_header(view, "qsgd", expected.param0, expected.param1, quantize::kFlagNonFinite, 2);
    const std::size_t buckets = quantize::bucket_count(numel, bucket_);
    quantize::check_section(view, "qsgd", 1, expected.section_bytes[1], "packed-level");
    scales_.resize(buckets);
    quantize::read_scales(view, "qsgd", 0, buckets, scales_.data());
    const auto* packed = reinterpret_cast<const std::uint8_t*>(view.sections[1].data());
    const bool stream = kernels::use_stream_stores(out, numel, accumulate);
    kernels::parallel_chunks(numel, quantize::bucket_chunk(bucket_), threads(),
                             [&](std::size_t, std::size_t begin, std::size_t end) {
                               for (std::size_t b0 = begin; b0 < end; b0 += bucket_) {
                                 kernels::signmag_decode_range(packed, b0, std::min(end, b0 + bucket_),
                                                               scales_[b0 / bucket_], bits_, out, accumulate, stream);
                               }
                               kernels::stream_fence(stream);
                             });
  }

 private:
  payload::Header header_for(std::size_t numel, DType dtype) const {
    payload::Header header;
    header.codec = payload::CodecId::kQsgd;
    header.numel = numel;
    header.dtype = dtype;
    header.section_count = 2;
    header.section_bytes[0] = quantize::bucket_count(numel, bucket_) * sizeof(float);
    header.section_bytes[1] = kernels::packed_bytes(numel, bits_);
    header.param0 = bits_ | (static_cast<std::uint32_t>(scale_) << 8);
    header.param1 = static_cast<std::uint32_t>(bucket_);
    return header;
  }

  unsigned bits_;
  std::size_t bucket_;
  ScaleKind scale_;
  std::uint64_t seed_;
  std::vector<float> scales_;
};

}  // namespace

CompressorInfo qsgd_compressor_info() {
  CompressorInfo info;
  info.name = "qsgd";
  info.summary = "QSGD: per-bucket scale + stochastically rounded sign/level codes (Alistarh et al. 2017)";
  info.traits.requantizable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kU8;
  info.params = qsgd_params();
  info.factory = [](const Params& params) -> std::unique_ptr<Compressor> {
    quantize::check_bucket_multiple("qsgd", params.get_int("bucket"), false);
    return std::make_unique<QsgdCompressor>(params);
  };
  return info;
}

}  // namespace gradcomp
