// The named tensors of one compress() call: CompressContext::segments, or the whole tensor as ctx.name. The
// error-feedback layer keys state by these names and encodes each segment as if it were alone, so a tensor keeps one
// residual and gets the same compression whether it travels alone, inside a fusion buffer or a DDP bucket, or split
// into scatter-reduce-allgather chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "gradcomp/compressor.h"

namespace gradcomp {

// The segments of a call over `numel` elements, with `total` filled in. Throws InvalidArgument (naming `codec`, the
// call's name and the rank) unless they cover [0, numel) in order, each fits its named tensor and no name repeats.
std::vector<TensorSegment> resolve_segments(const CompressContext& ctx, std::size_t numel, std::string_view codec);

// True when `segment` carries its named tensor whole (not a chunk of it).
inline bool is_whole(const TensorSegment& segment) { return segment.start == 0 && segment.numel == segment.total; }

// The key of a segment's random streams (Philox; random-k's indices, stochastic rounding, DGC's sample): the FNV-1a
// hash of the tensor's name, and of "<name>#<start>" for a chunk starting at element `start` of it. It depends only
// on the tensor and the chunk, never on the buffer that carries them.
std::uint64_t segment_stream_key(const TensorSegment& segment);

// The step a segment's codec sees: its own TensorSegment::step, or the call's.
inline std::uint64_t segment_step(const TensorSegment& segment, std::uint64_t call_step) {
  return segment.step == kStepOfCall ? call_step : segment.step;
}

// Index of the segment holding element `index` of the call (segments as resolve_segments returns them).
std::size_t segment_of(std::span<const TensorSegment> segments, std::size_t index);

}  // namespace gradcomp
