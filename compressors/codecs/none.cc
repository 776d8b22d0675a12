#include "compressors/codecs/none.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/codecs/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/bucket_reduce.h"
#include "kernels/cpu_parallel.h"
#include "kernels/wire_nan.cuh"

namespace gradcomp {
namespace {

class NoneCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit NoneCompressor(const Params& params)
      : ErrorFeedbackCompressor("none", payload::CodecId::kNone, none_compressor_info().traits,
                                lossless_common_params(), params) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    return payload::kHeaderBytes + numel * sizeof(float);
  }

 protected:
  // Fused non-finite scan: each copied chunk is checked while it is in cache (no residual, nothing to ping-pong).
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    payload::Header header;
    header.codec = payload::CodecId::kNone;
    header.numel = args.numel;
    header.dtype = args.original_dtype;
    header.section_count = 1;
    header.section_bytes[0] = args.numel * sizeof(float);
    const std::size_t size = payload::write_header(header, out);
    auto* body = reinterpret_cast<float*>(out.data() + payload::section_offset(header, 0));
    const float scale = args.ctx->prescale;
    const std::size_t chunks = (args.numel + kernels::kParallelChunk - 1) / kernels::kParallelChunk;
    std::vector<std::size_t> bad_count(chunks, 0), bad_first(chunks, args.numel);
    kernels::parallel_chunks(args.numel, kernels::kParallelChunk, args.threads,
                             [&](std::size_t k, std::size_t begin, std::size_t end) {
                               if (scale == 1.0f) {
                                 std::memcpy(body + begin, args.grad + begin, (end - begin) * sizeof(float));
                               } else {
                                 for (std::size_t i = begin; i < end; ++i) body[i] = args.grad[i] * scale;
                               }
                               // The fused non-finite scan, over the copy while it is in cache (a non-finite input
                               // always gives a non-finite copy); exact count only then.
                               if (kernels::any_nonfinite(body + begin, end - begin)) {
                                 kernels::count_nonfinite_range(args.grad, begin, end, bad_count[k], bad_first[k]);
                                 // memcpy kept the input NaN's bits: write the one wire NaN, as the GPU does.
                                 kernels::canonicalize_nans(body + begin, end - begin);
                               }
                             });
    quantize::report_nonfinite(bad_count, bad_first, args.numel, stats, args.first_nonfinite);
    stats.selected = args.numel;
    return size;
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    // No flags, no parameters, a float original dtype: anything else is corruption (as every other decoder says).
    quantize::check_header(view, "none", 0, 0, 0, 1);
    GRADCOMP_CHECK_AS(CorruptPayload, view.header.section_count == 1 && view.sections[0].size() == numel * sizeof(float),
                      "corrupt 'none' payload: body has {} bytes for {} elements", view.sections[0].size(), numel);
    // The body may sit at any byte offset of a gathered buffer: values are read with memcpy, never through a float*.
    const std::byte* body = view.sections[0].data();
    if (accumulate) {
      for (std::size_t i = 0; i < numel; ++i) {
        float v;
        std::memcpy(&v, body + i * sizeof(float), sizeof(float));
        out[i] += v;
      }
    } else if (numel > 0) {
      std::memcpy(out, body, numel * sizeof(float));
    }
  }
};

}  // namespace

CompressorInfo none_compressor_info() {
  CompressorInfo info;
  info.name = "none";
  info.summary = "no compression: f32 values, dense allreduce (the baseline)";
  info.traits.summable = true;
  info.traits.lossy = false;
  info.traits.wire_dtype = DType::kF32;
  info.params = lossless_common_params();
  info.factory = [](const Params& params) { return std::make_unique<NoneCompressor>(params); };
  return info;
}

}  // namespace gradcomp
