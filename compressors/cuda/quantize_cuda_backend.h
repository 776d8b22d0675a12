// CUDA backends of qsgd, terngrad and onebit (CUDA builds only).
#pragma once

#include <memory>

#include "compressors/framework/payload.h"
#include "gradcomp/registry.h"

namespace gradcomp {

class CudaCodec;

// The backend of `codec` (kQsgd, kTernGrad or kOneBit) configured as the CPU codec parses `params`, else null.
std::unique_ptr<CudaCodec> make_quantize_cuda_codec(payload::CodecId codec, const Params& params);

}  // namespace gradcomp
