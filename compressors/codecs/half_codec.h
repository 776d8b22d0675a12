// The codec behind `fp16` and `bf16`: values * prescale rounded to a 16-bit float (saturating, counted in
// CompressStats::saturated), one dense section, summable. Error feedback keeps v - decode(wire) / prescale, i.e. what
// rounding and saturation dropped, in the unscaled domain.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/codecs/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/bucket_reduce.h"
#include "kernels/cpu_parallel.h"
#include "compressors/codecs/half_cpu.h"

namespace gradcomp {

template <kernels::HalfFormat kFormat>
class HalfCodec final : public ErrorFeedbackCompressor {
 public:
  // `prescale_given`: use `prescale` instead of CompressContext::prescale.
  HalfCodec(std::string name, payload::CodecId codec, CompressorTraits traits, std::vector<ParamSpec> specs,
            const Params& params, bool prescale_given, float prescale)
      : ErrorFeedbackCompressor(std::move(name), codec, traits, std::move(specs), params),
        prescale_given_(prescale_given),
        prescale_(prescale) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    return payload::kHeaderBytes + numel * sizeof(std::uint16_t);
  }

 protected:
  // Fused non-finite scan: the encoded chunk is checked for Inf/NaN codes while it is in cache (see encode()).
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    payload::Header header;
    header.codec = codec();
    header.numel = args.numel;
    header.dtype = args.original_dtype;
    header.section_count = 1;
    header.section_bytes[0] = args.numel * sizeof(std::uint16_t);
    const std::size_t size = payload::write_header(header, out);
    auto* body = reinterpret_cast<std::uint16_t*>(out.data() + payload::section_offset(header, 0));
    const float prescale = prescale_given_ ? prescale_ : args.ctx->prescale;
    GRADCOMP_CHECK(prescale > 0.0f && std::isfinite(prescale), "compressor '{}': prescale {} for tensor '{}' must be "
                   "finite and > 0", name(), prescale, args.ctx->name);
    const std::size_t chunks = (args.numel + kernels::kParallelChunk - 1) / kernels::kParallelChunk;
    std::vector<std::size_t> saturated(chunks, 0), bad_count(chunks, 0), bad_first(chunks, args.numel);
    float* const r_out = args.residual_out ? args.residual_out : args.residual;
    const bool stream_out = args.residual_out && kernels::use_stream_stores(r_out, args.numel, false);
    kernels::parallel_chunks(args.numel, kernels::kParallelChunk, args.threads,
                             [&](std::size_t k, std::size_t begin, std::size_t end) {
                               const bool ef = args.residual != nullptr;
                               saturated[k] = kernels::half_encode_range<kFormat>(
                                   args.grad + begin, ef ? args.residual + begin : nullptr,
                                   ef ? r_out + begin : nullptr, end - begin, prescale, body + begin, stream_out);
                               kernels::stream_fence(stream_out);
                               // The fused non-finite scan: the chunk's encoded values are still in cache; a
                               // non-finite gradient value always encodes to Inf/NaN, so count exactly only then.
                               if (kernels::half_any_nonfinite<kFormat>(body + begin, end - begin)) {
                                 kernels::count_nonfinite_range(args.grad, begin, end, bad_count[k], bad_first[k]);
                               }
                             });
    for (const auto count : saturated) stats.saturated += count;
    quantize::report_nonfinite(bad_count, bad_first, args.numel, stats, args.first_nonfinite);
    stats.selected = args.numel;
    return size;
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    quantize::check_header(view, name(), 0, 0, 0, 1);
    quantize::check_section(view, name(), 0, numel * sizeof(std::uint16_t), "value");
    const auto* body = reinterpret_cast<const std::uint16_t*>(view.sections[0].data());
    const bool stream = kernels::use_stream_stores(out, numel, accumulate);
    kernels::parallel_chunks(numel, kernels::kParallelChunk, threads(),
                             [&](std::size_t, std::size_t begin, std::size_t end) {
                               kernels::half_decode_range<kFormat>(body + begin, end - begin, out + begin, accumulate,
                                                                   stream);
                               kernels::stream_fence(stream);
                             });
  }

 private:
  bool prescale_given_;
  float prescale_;
};

}  // namespace gradcomp
