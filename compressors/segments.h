// The named tensors of one compress() call: CompressContext::segments, or the whole tensor as ctx.name. The
// error-feedback layer keys state by these names, so a tensor keeps one residual whether it travels alone, inside a
// fusion buffer or a DDP bucket, or split into scatter-reduce-allgather chunks.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "gradcomp/compressor.h"

namespace gradcomp {

// The segments of a call over `numel` elements, with `total` filled in. Throws InvalidArgument (naming `codec`, the
// call's name and the rank) unless they cover [0, numel) in order, each fits its named tensor and no name repeats.
std::vector<TensorSegment> resolve_segments(const CompressContext& ctx, std::size_t numel, std::string_view codec);

// True when the call is one named tensor carried whole (its state can be used in place).
bool carried_whole(std::span<const TensorSegment> segments);

// Index of the segment holding element `index` of the call (segments as resolve_segments returns them).
std::size_t segment_of(std::span<const TensorSegment> segments, std::size_t index);

// Copies segment slices of per-name buffers into one contiguous buffer of the call (gather), and back (scatter).
// `sources[s]` / `targets[s]` is the full buffer of segment s's named tensor (`total` floats).
void gather_segments(std::span<const TensorSegment> segments, std::span<const float* const> sources, float* out);
void scatter_segments(std::span<const TensorSegment> segments, const float* in, std::span<float* const> targets);

}  // namespace gradcomp
