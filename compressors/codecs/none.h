// `none`: the uncompressed baseline. Payload = the f32 values (times ctx.prescale). Summable, lossless.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo none_compressor_info();

}  // namespace gradcomp
