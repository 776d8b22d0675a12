// `onebit`: 1-bit SGD with error feedback / EF-signSGD (Seide et al. 2014; Karimireddy et al. 2019). Per bucket of
// `bucket` values: scale S = mean |v|, one sign bit per value; decodes to +-S. Payload: section 0 = f32 scale per
// bucket, section 1 = sign bits (LSB first). Requantizable, lossy (biased; error feedback corrects it).
#pragma once

#include "compressors/codecs/quantize_common.h"
#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo onebit_compressor_info();

// The payload layout of onebit with `params` (validated by the registry): 1-bit codes, param0 = bucket, param1 = 1.
// Shared by the CPU codec and its CUDA backend.
quantize::BucketLayout onebit_layout(const Params& params);

}  // namespace gradcomp
