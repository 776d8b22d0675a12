// `terngrad`: TernGrad (Wen et al., NeurIPS 2017). Per bucket (default 512 values; bucket=0: one scale for the whole
// tensor, as in the paper) the scale S = max|v|, clipped to clip*sigma when clip > 0; each value is sent as
// S * sign(v) * Bernoulli(min(|v|, S) / S) (Philox). Payload: section 0 = f32 scale per bucket, section 1 = 2-bit
// sign-magnitude codes. Requantizable, lossy.
#pragma once

#include "compressors/codecs/quantize_common.h"
#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo terngrad_compressor_info();

// The payload layout of terngrad with `params` (validated by the registry): 2-bit codes, param0 = bucket (0 = one
// scale for the whole tensor), param1 = 2. Shared by the CPU codec and its CUDA backend.
quantize::BucketLayout terngrad_layout(const Params& params);

}  // namespace gradcomp
