#include "compressors/codecs/bf16.h"

#include "compressors/codecs/half_codec.h"

namespace gradcomp {

CompressorInfo bf16_compressor_info() {
  CompressorInfo info;
  info.name = "bf16";
  info.summary = "bfloat16, round to nearest even, dense allreduce";
  info.traits.summable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kBF16;
  info.params = lossy_common_params();
  info.factory = [traits = info.traits](const Params& params) -> std::unique_ptr<Compressor> {
    return std::make_unique<HalfCodec<kernels::HalfFormat::kBF16>>("bf16", payload::CodecId::kBf16, traits,
                                                                   lossy_common_params(), params, false, 1.0f);
  };
  return info;
}

}  // namespace gradcomp
