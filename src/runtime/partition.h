// Partitioning: a large tensor that travels alone is reduced as several parts, each its own buffer on the pipeline's
// lanes, so that while one part is on the wire the next is encoded into the communicator's buffer and the one before
// decoded out of it: the copies of a large gradient hide behind its own communication instead of adding to it.
// Only where encoding an element range gives the bits and the error-feedback state of encoding the whole tensor.
// Private to src/runtime.
#pragma once

#include <cstddef>

#include "gradcomp/collectives.h"
#include "src/runtime/executor.h"

namespace gradcomp::runtime {

// How many parts `prepared` is reduced in: 1 (whole) unless it is one host tensor of at least 2 x `part_bytes`
// bytes (`part_bytes` > 0) whose codec encodes element ranges as it encodes the whole (a summable error-feedback
// codec — none, fp16, bf16 — under the dense algorithm of `algorithm`, with non-finite policy raise or pass: skip
// zeroes a whole tensor); then ceil(bytes / part_bytes).
std::size_t partition_count(const Executor::Prepared& prepared, std::size_t part_bytes, AllreduceAlgorithm algorithm);

// Part `index` of `count` (as partition_count gave) of `prepared`: its member's elements [numel * index / count,
// numel * (index + 1) / count), carried as that range of the whole tensor (Member::start, Member::total: error
// feedback keyed by the tensor's name, at the range's own elements), with the same codec, owner and step.
Executor::Prepared partition_part(const Executor::Prepared& prepared, std::size_t index, std::size_t count);

}  // namespace gradcomp::runtime
