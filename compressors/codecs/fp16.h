// `fp16`: IEEE half precision on the wire (values * prescale, round to nearest even). Values beyond the half range
// saturate to +-65504 and are counted in CompressStats::saturated (never a silent inf). Summable (wire f16), lossy.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo fp16_compressor_info();

}  // namespace gradcomp
