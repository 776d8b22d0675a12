// CUDA backends of none, fp16 and bf16 (CUDA builds only).
#pragma once

#include <memory>

#include "compressors/framework/payload.h"
#include "gradcomp/registry.h"

namespace gradcomp {

class CudaCodec;

// The backend of `codec` (kNone, kFp16 or kBf16), or null for any other codec.
std::unique_ptr<CudaCodec> make_dense_cuda_codec(payload::CodecId codec, const Params& params);

}  // namespace gradcomp
