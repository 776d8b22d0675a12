#include "compressors/terngrad.h"

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

constexpr unsigned kBits = 2;  // sign + one level: {-S, 0, +S}

std::vector<ParamSpec> terngrad_params() {
  std::vector<ParamSpec> params = {
      ParamSpec{"clip", ParamSpec::Kind::kFloat, "2.5", 0, 1000, false, {},
                "clip |v| at clip * sigma of the bucket before ternarizing (0 = off; the paper uses 2.5)"},
      quantize::bucket_param("512", 0, "values per scale (a multiple of 8), or 0 for one scale per tensor"),
      quantize::seed_param(),
  };
  for (auto& common : lossy_common_params()) params.push_back(std::move(common));
  return params;
}

// Scale of a bucket from its statistics: max|v|, clipped at clip * sigma, where sigma is the root mean square of the
// bucket (its standard deviation about zero: gradients are near zero-mean, and unlike the centred deviation it never
// clips a constant bucket, e.g. a 1-element tail, to 0, which would transmit nothing forever).
float scale_from(const kernels::BucketStats& s, std::size_t n, float clip) {
  float sigma = 0.0f;
  if (clip > 0.0f && n > 0) {
    sigma = static_cast<float>(std::sqrt(static_cast<double>(s.sum_sq) / static_cast<double>(n)));
    if (!std::isfinite(s.sum_sq)) sigma = std::numeric_limits<float>::max();  // overflowed: do not clip
  }
  return kernels::terngrad_scale(s.max_abs, sigma, clip);
}

class TernGradCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit TernGradCompressor(const Params& params)
      : ErrorFeedbackCompressor("terngrad", payload::CodecId::kTernGrad, terngrad_compressor_info().traits,
                                terngrad_params(), params),
        clip_(static_cast<float>(params.get_float("clip"))),
        bucket_(static_cast<std::size_t>(params.get_int("bucket"))),
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
    GRADCOMP_CHECK(out.size() >= payload::total_bytes(header), "terngrad: output buffer of {} bytes is too small ({})",
                   out.size(), payload::total_bytes(header));
    std::byte* scales = out.data() + payload::section_offset(header, 0);
    auto* packed = reinterpret_cast<std::uint8_t*>(out.data() + payload::section_offset(header, 1));
    const auto stream = kernels::PhiloxStream::make(seed_, args.tensor_key, args.ctx->step);
    const float prescale = args.ctx->prescale;
    const std::size_t bucket = bucket_ ? bucket_ : n;
    constexpr unsigned kMask = kernels::kStatMax | kernels::kStatSq;
    bool any_bad = false;
    float* r_out = args.residual_out ? args.residual_out : args.residual;
    const bool stream_out = args.residual_out && kernels::use_stream_stores(r_out, n, false);
    const kernels::SignMagQuantizer quantizer(kBits, stream);
    // Non-finite gradient values per parallel chunk (counted only where v = g + r was flagged), combined in chunk
    // order so the result does not depend on the thread count.
    const std::size_t chunk = bucket_ == 0 ? kernels::kParallelChunk : quantize::bucket_chunk(bucket);
    const std::size_t chunks = n == 0 ? 0 : (n + chunk - 1) / chunk;
    std::vector<std::size_t> bad_count(chunks, 0), bad_first(chunks, n);
    if (n == 0) {
      // nothing to encode
    } else if (bucket_ == 0) {
      // One scale for the whole tensor: a statistics pass over fixed chunks (partials combined in chunk order), then
      // a quantization pass.
      std::vector<kernels::BucketStats> partial(chunks);
      kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
        partial[k] = kernels::bucket_stats<kMask>(args.grad + begin, args.residual ? args.residual + begin : nullptr,
                                                  end - begin);
      });
      kernels::BucketStats total;
      for (const auto& p : partial) {
        total.max_abs = total.max_abs > p.max_abs ? total.max_abs : p.max_abs;
        total.sum_sq += p.sum_sq;
        total.nonfinite = total.nonfinite || p.nonfinite;
      }
      const float scale = scale_from(total, n, clip_);
      any_bad = total.nonfinite;
      kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
        if (any_bad) {
          if (partial[k].nonfinite) kernels::count_nonfinite_range(args.grad, begin, end, bad_count[k], bad_first[k]);
          kernels::signmag_nonfinite_range(args.grad, args.residual, r_out, begin, end, kBits, packed);
        } else {
          quantizer.quantize(args.grad, args.residual, r_out, begin, end, scale, packed, stream_out);
          kernels::stream_fence(stream_out);
        }
      });
      const float wire = any_bad ? std::numeric_limits<float>::quiet_NaN() : scale * prescale;
      std::memcpy(scales, &wire, sizeof(float));
    } else {
      std::vector<std::uint8_t> bad(chunks, 0);
      kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
        for (std::size_t b0 = begin; b0 < end; b0 += bucket) {
          const std::size_t b1 = std::min(end, b0 + bucket);
          const auto s = kernels::bucket_stats<kMask>(args.grad + b0, args.residual ? args.residual + b0 : nullptr,
                                                      b1 - b0);
          float wire = 0.0f;
          if (s.nonfinite) {
            wire = std::numeric_limits<float>::quiet_NaN();
            bad[k] = 1;
            kernels::count_nonfinite_range(args.grad, b0, b1, bad_count[k], bad_first[k]);
            kernels::signmag_nonfinite_range(args.grad, args.residual, r_out, b0, b1, kBits, packed);
          } else {
            const float scale = scale_from(s, b1 - b0, clip_);
            wire = scale * prescale;
            quantizer.quantize(args.grad, args.residual, r_out, b0, b1, scale, packed, stream_out);
          }
          std::memcpy(scales + (b0 / bucket) * sizeof(float), &wire, sizeof(float));
        }
        kernels::stream_fence(stream_out);
      });
      for (const auto flag : bad) any_bad = any_bad || flag;
    }
    const auto tally = quantize::combine_nonfinite(bad_count, bad_first, n);
    stats.nonfinite = tally.count;
    if (args.first_nonfinite) *args.first_nonfinite = tally.first;
    if (any_bad) header.flags |= quantize::kFlagNonFinite;
    stats.selected = n;
    return payload::write_header(header, out);
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    const payload::Header expected = header_for(numel, DType::kF32);
    quantize::check_header(view, "terngrad", expected.param0, expected.param1, quantize::kFlagNonFinite, 2);
    const std::size_t bucket = bucket_ ? bucket_ : std::max<std::size_t>(numel, 1);
    const std::size_t buckets = quantize::bucket_count(numel, bucket);
    quantize::check_section(view, "terngrad", 1, expected.section_bytes[1], "packed-code");
    scales_.resize(buckets);
    quantize::read_scales(view, "terngrad", 0, buckets, scales_.data());
    const auto* packed = reinterpret_cast<const std::uint8_t*>(view.sections[1].data());
    const std::size_t chunk = bucket_ ? quantize::bucket_chunk(bucket) : kernels::kParallelChunk;
    const bool stream = kernels::use_stream_stores(out, numel, accumulate);
    kernels::parallel_chunks(numel, chunk, threads(), [&](std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t b0 = begin; b0 < end;) {
        const std::size_t b1 = std::min(end, (b0 / bucket + 1) * bucket);
        kernels::signmag_decode_range(packed, b0, b1, scales_[b0 / bucket], kBits, out, accumulate, stream);
        b0 = b1;
      }
      kernels::stream_fence(stream);
    });
  }

 private:
  payload::Header header_for(std::size_t numel, DType dtype) const {
    const std::size_t bucket = bucket_ ? bucket_ : std::max<std::size_t>(numel, 1);
    payload::Header header;
    header.codec = payload::CodecId::kTernGrad;
    header.numel = numel;
    header.dtype = dtype;
    header.section_count = 2;
    header.section_bytes[0] = quantize::bucket_count(numel, bucket) * sizeof(float);
    header.section_bytes[1] = kernels::packed_bytes(numel, kBits);
    header.param0 = static_cast<std::uint32_t>(bucket_);
    header.param1 = kBits;
    return header;
  }

  float clip_;
  std::size_t bucket_;
  std::uint64_t seed_;
  std::vector<float> scales_;
};

}  // namespace

CompressorInfo terngrad_compressor_info() {
  CompressorInfo info;
  info.name = "terngrad";
  info.summary = "TernGrad: per-bucket scale (clipped at clip*sigma) + stochastic ternary codes (Wen et al. 2017)";
  info.traits.requantizable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kU8;
  info.params = terngrad_params();
  info.factory = [](const Params& params) -> std::unique_ptr<Compressor> {
    quantize::check_bucket_multiple("terngrad", params.get_int("bucket"), true);
    return std::make_unique<TernGradCompressor>(params);
  };
  return info;
}

}  // namespace gradcomp
