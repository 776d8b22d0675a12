// CUDA backends of the dense codecs: none (f32), fp16, bf16. Payload: the 64-byte header and one section of n wire
// values, exactly as the CPU codecs write it.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/dense_cuda.h"

#include "compressors/cuda_codec.h"
#include "gradcomp/error.h"
#include "kernels/dense_cuda.h"

namespace gradcomp {
namespace {

class DenseCudaCodec final : public CudaCodec {
 public:
  DenseCudaCodec(payload::CodecId codec, kernels::DenseWire wire, bool saturate)
      : codec_(codec), wire_(wire), saturate_(saturate) {}

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
    params.prescale = args.ctx->prescale;
    params.saturate = saturate_;
    kernels::launch_dense_encode(params, args.grad, args.buffers[0], args.next[0],
                                 out + payload::section_offset(header, 0), args.numel, args.counters, args.stream);
    stats.selected = args.numel;
    return payload::total_bytes(header);
  }

  void decode(const CudaDecodeArgs& args) override {
    const auto& view = *args.view;
    GRADCOMP_CHECK_AS(CorruptPayload,
                      view.header.section_count == 1 && view.sections[0].size() == args.numel * wire_bytes(),
                      "corrupt '{}' payload: body has {} bytes for {} elements", payload::codec_name(codec_),
                      view.sections[0].size(), args.numel);
    kernels::launch_dense_decode(wire_, view.sections[0].data(), args.out, args.numel, args.accumulate, args.stream);
  }

 private:
  std::size_t wire_bytes() const { return wire_ == kernels::DenseWire::kF32 ? 4 : 2; }

  payload::CodecId codec_;
  kernels::DenseWire wire_;
  bool saturate_;
};

}  // namespace

std::unique_ptr<CudaCodec> make_dense_cuda_codec(payload::CodecId codec, const Params& params) {
  switch (codec) {
    case payload::CodecId::kNone:
      return std::make_unique<DenseCudaCodec>(codec, kernels::DenseWire::kF32, false);
    case payload::CodecId::kFp16:
      return std::make_unique<DenseCudaCodec>(codec, kernels::DenseWire::kF16,
                                              !params.has("saturate") || params.get_bool("saturate"));
    case payload::CodecId::kBf16:
      return std::make_unique<DenseCudaCodec>(codec, kernels::DenseWire::kBF16, false);
    default:
      return nullptr;
  }
}

}  // namespace gradcomp
#endif
