// CUDA backends of qsgd, terngrad and onebit: the CPU codecs' payloads (header params, a section of f32 bucket
// scales, a section of packed codes), written by kernels/quantize_cuda.cu.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/quantize_cuda.h"

#include <algorithm>

#include "compressors/cuda_codec.h"
#include "compressors/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/bitpack_ops.cuh"
#include "kernels/cuda_check.h"
#include "kernels/quantize_cuda.h"

namespace gradcomp {
namespace {

class QuantizeCudaCodec final : public CudaCodec {
 public:
  QuantizeCudaCodec(payload::CodecId codec, kernels::QuantizeParams params, std::uint64_t seed)
      : codec_(codec), params_(params), seed_(seed) {}

  std::size_t workspace_bytes(std::size_t numel) const override {
    std::size_t bytes = 0;
    kernels::launch_quantize_encode(params_, nullptr, nullptr, nullptr, nullptr, nullptr, numel, nullptr, nullptr, 0,
                                    nullptr, bytes, nullptr);
    return bytes;
  }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const payload::Header header = header_for(args.numel, args.original_dtype);
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

  void decode(const CudaDecodeArgs& args) override {
    const auto& view = *args.view;
    const std::size_t n = args.numel;
    const payload::Header expected = header_for(n, DType::kF32);
    const auto name = payload::codec_name(codec_);
    quantize::check_header(view, name, expected.param0, expected.param1, quantize::kFlagNonFinite, 2);
    const std::size_t bucket = effective_bucket(n);
    const std::size_t buckets = quantize::bucket_count(n, bucket);
    quantize::check_section(view, name, 0, buckets * sizeof(float), "scale");
    quantize::check_section(view, name, 1, expected.section_bytes[1], "packed-code");
    const auto* scales = view.sections[0].data();
    kernels::launch_check_scales(scales, buckets, (view.header.flags & quantize::kFlagNonFinite) != 0,
                                 args.error_flag, args.stream);
    int bad = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&bad, args.error_flag, sizeof(int), cudaMemcpyDeviceToHost, args.stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(args.stream));
    GRADCOMP_CHECK_AS(CorruptPayload, bad == 0,
                      "corrupt '{}' payload: a bucket scale is negative or non-finite ({} buckets of {})", name,
                      buckets, bucket);
    kernels::launch_quantize_decode(params_.bits, params_.kind == kernels::QuantKind::kOneBit, bucket, scales,
                                    reinterpret_cast<const std::uint8_t*>(view.sections[1].data()), args.out, n,
                                    args.accumulate, args.stream);
  }

 private:
  std::size_t effective_bucket(std::size_t n) const {
    return params_.bucket ? params_.bucket : std::max<std::size_t>(n, 1);
  }

  // The CPU codecs' header_for().
  payload::Header header_for(std::size_t n, DType dtype) const {
    payload::Header header;
    header.codec = codec_;
    header.numel = n;
    header.dtype = dtype;
    header.section_count = 2;
    header.section_bytes[0] = quantize::bucket_count(n, effective_bucket(n)) * sizeof(float);
    header.section_bytes[1] = kernels::packed_bytes(n, params_.bits);
    switch (params_.kind) {
      case kernels::QuantKind::kQsgdMax:
      case kernels::QuantKind::kQsgdL2:
        header.param0 = params_.bits | ((params_.kind == kernels::QuantKind::kQsgdL2 ? 1u : 0u) << 8);
        header.param1 = static_cast<std::uint32_t>(params_.bucket);
        break;
      case kernels::QuantKind::kTernGrad:
      case kernels::QuantKind::kOneBit:
        header.param0 = static_cast<std::uint32_t>(params_.bucket);
        header.param1 = params_.bits;
        break;
    }
    return header;
  }

  payload::CodecId codec_;
  kernels::QuantizeParams params_;
  std::uint64_t seed_;
};

}  // namespace

std::unique_ptr<CudaCodec> make_quantize_cuda_codec(payload::CodecId codec, const Params& params) {
  kernels::QuantizeParams p;
  std::uint64_t seed = 0;
  switch (codec) {
    case payload::CodecId::kQsgd:
      p.kind = params.get_string("scale") == "l2" ? kernels::QuantKind::kQsgdL2 : kernels::QuantKind::kQsgdMax;
      p.bits = static_cast<unsigned>(params.get_int("bits"));
      p.bucket = static_cast<std::size_t>(params.get_int("bucket"));
      seed = static_cast<std::uint64_t>(params.get_int("seed"));
      break;
    case payload::CodecId::kTernGrad:
      p.kind = kernels::QuantKind::kTernGrad;
      p.bits = 2;
      p.bucket = static_cast<std::size_t>(params.get_int("bucket"));
      p.clip = static_cast<float>(params.get_float("clip"));
      seed = static_cast<std::uint64_t>(params.get_int("seed"));
      break;
    case payload::CodecId::kOneBit:
      p.kind = kernels::QuantKind::kOneBit;
      p.bits = 1;
      p.bucket = static_cast<std::size_t>(params.get_int("bucket"));
      break;
    default:
      return nullptr;
  }
  return std::make_unique<QuantizeCudaCodec>(codec, p, seed);
}

}  // namespace gradcomp
#endif
