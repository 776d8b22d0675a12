// `bf16`: bfloat16 on the wire (values * CompressContext::prescale, round to nearest even). Summable (wire bf16),
// lossy; error feedback keeps the rounding error.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo bf16_compressor_info();

}  // namespace gradcomp
