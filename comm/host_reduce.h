// Element-wise reductions on host memory for the communicators that reduce themselves (in-process, MPI's kAverage).
#pragma once

#include <cstddef>

#include "gradcomp/communicator.h"
#include "gradcomp/tensor.h"

namespace gradcomp::comm {

// acc[i] = acc[i] (op) in[i] for `n` elements of `dtype` (kAverage accumulates like kSum). f16/bf16 are added in
// f32 and rounded once per call (round to nearest even).
void reduce_into(void* acc, const void* in, std::size_t n, DType dtype, ReduceOp op);

// data[i] /= divisor for floating types (the last step of kAverage).
void divide_by(void* data, std::size_t n, DType dtype, int divisor);

}  // namespace gradcomp::comm
