// CUDA backends of qsgd, terngrad and onebit: the CPU codecs' payloads (their quantize::BucketLayout: header params,
// a section of f32 bucket scales, a section of packed codes), written by kernels/quantize_cuda.cu. Each codec's CUDA
// rule is its kernel kind (scale and level rule) and the parameters that kind reads.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/cuda/quantize_cuda_backend.h"

#include "compressors/cuda/cuda_codec.h"
#include "compressors/codecs/onebit.h"
#include "compressors/codecs/qsgd.h"
#include "compressors/codecs/quantize_common.h"
#include "compressors/codecs/terngrad.h"
#include "gradcomp/error.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_buffer.h"
#include "kernels/quantize_cuda.h"

namespace gradcomp {
namespace {

class QuantizeCudaCodec final : public CudaCodec {
 public:
  QuantizeCudaCodec(const quantize::BucketLayout& layout, kernels::QuantizeParams params, std::uint64_t seed)
      : layout_(layout), params_(params), seed_(seed) {}

  std::size_t workspace_bytes(std::size_t numel) const override {
    std::size_t bytes = 0;
    kernels::launch_quantize_encode(params_, nullptr, nullptr, nullptr, nullptr, nullptr, numel, nullptr, nullptr, 0,
                                    nullptr, bytes, nullptr);
    return bytes;
  }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const payload::Header header = layout_.header(args.numel, args.original_dtype);
    write_header_device(header, out, args.stream);
    kernels::QuantizeParams p = params_;
    p.prescale = args.ctx->prescale;
    p.stream = kernels::PhiloxStream::make(seed_, args.tensor_key, args.ctx->step);
    std::size_t bytes = workspace_bytes(args.numel);
    kernels::launch_quantize_encode(
        p, args.grad, args.buffers[0], args.next[0], out + payload::section_offset(header, 0),
        reinterpret_cast<std::uint8_t*>(out + payload::section_offset(header, 1)), args.numel, args.counters,
        reinterpret_cast<std::uint16_t*>(out + 18), quantize::kFlagNonFinite,
        args.workspace, bytes, args.stream);
    stats.selected = args.numel;
    return payload::total_bytes(header);
  }

  bool validate(const CudaDecodeArgs& args) override {
    const auto& view = *args.view;
    const std::size_t buckets = layout_.check(view, args.numel);
    kernels::launch_check_scales(view.sections[0].data(), buckets,
                                 (view.header.flags & quantize::kFlagNonFinite) != 0, args.error_flag, args.stream);
    return true;
  }

  void checked(const CudaDecodeArgs& args, int flag, std::uint64_t) const override {
    GRADCOMP_CHECK_AS(CorruptPayload, flag == 0,
                      "corrupt '{}' payload: a bucket scale is negative or non-finite ({} values in buckets of {})",
                      layout_.name, args.numel, layout_.effective_bucket(args.numel));
  }

  void decode(const CudaDecodeArgs& args) override {
    const auto& view = *args.view;
    kernels::launch_quantize_decode(layout_.bits, params_.kind == kernels::QuantKind::kOneBit,
                                    layout_.effective_bucket(args.numel), view.sections[0].data(),
                                    reinterpret_cast<const std::uint8_t*>(view.sections[1].data()), args.out,
                                    args.numel, args.accumulate, args.stream);
  }

 private:
  quantize::BucketLayout layout_;  // the CPU codec's payload: header and validation
  kernels::QuantizeParams params_;
  std::uint64_t seed_;
};

}  // namespace

std::unique_ptr<CudaCodec> make_quantize_cuda_codec(payload::CodecId codec, const Params& params) {
  quantize::BucketLayout layout;
  kernels::QuantizeParams p;
  std::uint64_t seed = 0;
  switch (codec) {
    case payload::CodecId::kQsgd:
      layout = qsgd_layout(params);
      p.kind = params.get_string("scale") == "l2" ? kernels::QuantKind::kQsgdL2 : kernels::QuantKind::kQsgdMax;
      seed = static_cast<std::uint64_t>(params.get_int("seed"));
      break;
    case payload::CodecId::kTernGrad:
      layout = terngrad_layout(params);
      p.kind = kernels::QuantKind::kTernGrad;
      p.clip = static_cast<float>(params.get_float("clip"));
      seed = static_cast<std::uint64_t>(params.get_int("seed"));
      break;
    case payload::CodecId::kOneBit:
      layout = onebit_layout(params);
      p.kind = kernels::QuantKind::kOneBit;
      break;
    default:
      return nullptr;
  }
  p.bits = layout.bits;
  p.bucket = layout.bucket;
  return std::make_unique<QuantizeCudaCodec>(layout, p, seed);
}

}  // namespace gradcomp
#endif
