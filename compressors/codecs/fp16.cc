#include "compressors/codecs/fp16.h"

#include <cmath>

#include "compressors/codecs/half_codec.h"

namespace gradcomp {
namespace {

std::vector<ParamSpec> fp16_params() {
  std::vector<ParamSpec> params = {
      ParamSpec{"prescale", ParamSpec::Kind::kFloat, "", 0, 1e30, true, {},
                "multiply values by this before rounding (absent: the communicator's 1/world_size, so a half-precision "
                "sum cannot overflow)"},
  };
  for (auto& common : lossy_common_params()) params.push_back(std::move(common));
  return params;
}

}  // namespace

CompressorInfo fp16_compressor_info() {
  CompressorInfo info;
  info.name = "fp16";
  info.summary = "IEEE half precision, saturating at +-65504 (counted), dense allreduce";
  info.traits.summable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kF16;
  info.params = fp16_params();
  info.factory = [traits = info.traits](const Params& params) -> std::unique_ptr<Compressor> {
    const bool given = params.has("prescale") && !params.get_string("prescale").empty();
    const float prescale = given ? static_cast<float>(params.get_float("prescale")) : 1.0f;
    GRADCOMP_CHECK(!given || (std::isfinite(prescale) && prescale > 0.0f),
                   "compressor 'fp16': prescale={} must be a positive finite f32", params.get_string("prescale"));
    return std::make_unique<HalfCodec<kernels::HalfFormat::kF16>>("fp16", payload::CodecId::kFp16, traits,
                                                                  fp16_params(), params, given, prescale);
  };
  return info;
}

}  // namespace gradcomp
