// The error-feedback layer's conversions between a gradient view of f32, f16 or bf16 and the f32 values its codecs
// encode and decode (compressors/framework/error_feedback.cc).
#pragma once

#include <string_view>
#include <vector>

#include "gradcomp/tensor.h"

namespace gradcomp {

// `view` (host, f16 or bf16) as f32 values in `out` (resized to its numel), or at `out` (numel values).
void to_float(const TensorView& view, std::vector<float>& out);
void to_float(const TensorView& view, float* out);
// `values` rounded into `view` (host, f16 or bf16, values.size() elements).
void from_float(const std::vector<float>& values, const TensorView& view);
// Throws InvalidArgument naming `codec` and `what` unless `view` is f32, f16 or bf16.
void check_float_dtype(const TensorView& view, std::string_view codec, std::string_view what);

}  // namespace gradcomp
