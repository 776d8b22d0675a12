// CUDA backends of the sparsifiers (CUDA builds only).
#pragma once

#include <memory>

#include "compressors/payload.h"
#include "gradcomp/registry.h"

namespace gradcomp {

class CudaCodec;

// The backend of `codec` configured as the CPU codec parses `params`, or null when it has none.
std::unique_ptr<CudaCodec> make_sparse_cuda_codec(payload::CodecId codec, const Params& params);

}  // namespace gradcomp
