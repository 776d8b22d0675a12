// `qsgd`: QSGD (Alistarh et al., NeurIPS 2017). Per bucket of `bucket` values: scale S = max|v| or ||v||_2, each value
// stochastically rounded to sign + one of 2^(bits-1)-1 levels (Philox keyed by seed, step, tensor name, index).
// Payload: section 0 = f32 scale per bucket, section 1 = packed `bits`-bit codes. Requantizable, lossy.
#pragma once

#include "compressors/codecs/quantize_common.h"
#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo qsgd_compressor_info();

// The payload layout of qsgd with `params` (validated by the registry): bits, bucket, param0 = bits | scale kind << 8
// (max = 0, l2 = 1), param1 = bucket. Shared by the CPU codec and its CUDA backend.
quantize::BucketLayout qsgd_layout(const Params& params);

}  // namespace gradcomp
