// `blocktopk`: block top-k sparsification with error feedback. v = residual + grad is cut into fixed blocks of
// `block` elements (the last one may be shorter); the kb = max(1, round(ratio * blocks)) blocks with the largest L2
// norm (ties: lower block id) are sent whole as int32 block ids + their contiguous values. Gatherable, lossy.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo blocktopk_compressor_info();

}  // namespace gradcomp
