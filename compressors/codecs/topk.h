// `topk`: exact top-k sparsification with error feedback (Stich et al. 2018, "Sparsified SGD with memory").
// Sends the k entries of v = residual + grad with the largest |v| (ties: lower index first) as (int32 index, value)
// pairs; keeps the rest in the residual. Parameters: ratio (default 0.01) or k (mutually exclusive), values=f32|f16.
// Gatherable, lossy. See docs/sparsifiers.md.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo topk_compressor_info();

}  // namespace gradcomp
