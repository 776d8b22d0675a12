// CUDA backends of the dense codecs: none (f32), fp16, bf16. Payload: the 64-byte header and one section of n wire
// values, exactly as the CPU codecs write it.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/cuda/dense_cuda_backend.h"

#include <cmath>

#include "compressors/cuda/cuda_codec.h"
#include "compressors/codecs/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/dense_cuda.h"

namespace gradcomp {
namespace {

class DenseCudaCodec final : public CudaCodec {
 public:
  // `prescale_override` > 0: fp16's prescale=... parameter, used instead of CompressContext::prescale.
  DenseCudaCodec(payload::CodecId codec, kernels::DenseWire wire, float prescale_override)
      : codec_(codec), wire_(wire), prescale_override_(prescale_override) {}

  std::size_t workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    payload::Header header;
    header.codec = codec_;
    header.numel = args.numel;
    header.dtype = args.original_dtype;
    header.section_count = 1;
    header.section_bytes[0] = args.numel * wire_bytes();
    write_header_device(header, out, args.stream);
    kernels::DenseEncodeParams params;
    params.wire = wire_;
    params.prescale = prescale_override_ > 0.0f ? prescale_override_ : args.ctx->prescale;
    GRADCOMP_CHECK(codec_ == payload::CodecId::kNone || (params.prescale > 0.0f && std::isfinite(params.prescale)),
                   "compressor '{}': prescale {} for tensor '{}' must be finite and > 0", payload::codec_name(codec_),
                   params.prescale, args.ctx->name);
    kernels::launch_dense_encode(params, args.grad, args.buffers[0], args.next[0],
                                 out + payload::section_offset(header, 0), args.numel, args.counters, args.stream);
    stats.selected = args.numel;
    return payload::total_bytes(header);
  }

  bool validate(const CudaDecodeArgs& args) override {
    const auto& view = *args.view;
    // No flags, no parameters, a float original dtype, one section (none too, as its CPU decoder checks).
    quantize::check_header(view, payload::codec_name(codec_), 0, 0, 0, 1);
    GRADCOMP_CHECK_AS(CorruptPayload,
                      view.header.section_count == 1 && view.sections[0].size() == args.numel * wire_bytes(),
                      "corrupt '{}' payload: body has {} bytes for {} elements", payload::codec_name(codec_),
                      view.sections[0].size(), args.numel);
    return false;  // every wire value decodes
  }

  void decode(const CudaDecodeArgs& args) override {
    kernels::launch_dense_decode(wire_, args.view->sections[0].data(), args.out, args.numel, args.accumulate,
                                 args.stream);
  }

 private:
  std::size_t wire_bytes() const { return wire_ == kernels::DenseWire::kF32 ? 4 : 2; }

  payload::CodecId codec_;
  kernels::DenseWire wire_;
  float prescale_override_;
};

}  // namespace

std::unique_ptr<CudaCodec> make_dense_cuda_codec(payload::CodecId codec, const Params& params) {
  switch (codec) {
    case payload::CodecId::kNone:
      return std::make_unique<DenseCudaCodec>(codec, kernels::DenseWire::kF32, 0.0f);
    case payload::CodecId::kFp16: {
      const bool given = params.has("prescale") && !params.get_string("prescale").empty();
      return std::make_unique<DenseCudaCodec>(codec, kernels::DenseWire::kF16,
                                              given ? static_cast<float>(params.get_float("prescale")) : 0.0f);
    }
    case payload::CodecId::kBf16:
      return std::make_unique<DenseCudaCodec>(codec, kernels::DenseWire::kBF16, 0.0f);
    default:
      return nullptr;
  }
}

}  // namespace gradcomp
#endif
