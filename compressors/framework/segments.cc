#include "compressors/framework/segments.h"

#include <algorithm>
#include <string>
#include <set>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "kernels/fnv1a.cuh"

namespace gradcomp {

std::vector<TensorSegment> resolve_segments(const CompressContext& ctx, std::size_t numel, std::string_view codec) {
  if (ctx.segments.empty()) return {TensorSegment{ctx.name, 0, numel, 0, numel}};
  std::vector<TensorSegment> segments(ctx.segments.begin(), ctx.segments.end());
  std::set<std::string_view> names;
  std::size_t next = 0;
  for (TensorSegment& segment : segments) {
    if (segment.total == 0) segment.total = segment.numel;
    GRADCOMP_CHECK(!segment.name.empty(), "compressor '{}': a segment of '{}' on rank {} has an empty name", codec,
                   ctx.name, ctx.rank);
    GRADCOMP_CHECK(segment.offset == next,
                   "compressor '{}': segment '{}' of '{}' on rank {} starts at element {}, expected {} (segments must "
                   "cover the tensor in order without gaps)",
                   codec, segment.name, ctx.name, ctx.rank, segment.offset, next);
    GRADCOMP_CHECK(segment.start <= segment.total && segment.numel <= segment.total - segment.start,
                   "compressor '{}': segment '{}' of '{}' on rank {} carries elements [{}, {}) of a tensor of {}",
                   codec, segment.name, ctx.name, ctx.rank, segment.start, segment.start + segment.numel,
                   segment.total);
    GRADCOMP_CHECK(names.insert(segment.name).second,
                   "compressor '{}': tensor '{}' appears twice among the segments of '{}' on rank {}", codec,
                   segment.name, ctx.name, ctx.rank);
    next += segment.numel;
  }
  GRADCOMP_CHECK(next == numel, "compressor '{}': the segments of '{}' on rank {} cover {} elements, the tensor has {}",
                 codec, ctx.name, ctx.rank, next, numel);
  return segments;
}

std::uint64_t segment_stream_key(const TensorSegment& segment) {
  if (segment.start == 0) return kernels::fnv1a64(segment.name.data(), segment.name.size());
  const std::string chunk = fmt::format("{}#{}", segment.name, segment.start);
  return kernels::fnv1a64(chunk.data(), chunk.size());
}

std::size_t segment_of(std::span<const TensorSegment> segments, std::size_t index) {
  const auto it = std::upper_bound(segments.begin(), segments.end(), index,
                                   [](std::size_t i, const TensorSegment& s) { return i < s.offset; });
  return static_cast<std::size_t>(it - segments.begin()) - 1;
}

}  // namespace gradcomp
