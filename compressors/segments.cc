#include "compressors/segments.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "gradcomp/error.h"

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

bool carried_whole(std::span<const TensorSegment> segments) {
  return segments.size() == 1 && segments[0].start == 0 && segments[0].numel == segments[0].total;
}

std::size_t segment_of(std::span<const TensorSegment> segments, std::size_t index) {
  const auto it = std::upper_bound(segments.begin(), segments.end(), index,
                                   [](std::size_t i, const TensorSegment& s) { return i < s.offset; });
  return static_cast<std::size_t>(it - segments.begin()) - 1;
}

void gather_segments(std::span<const TensorSegment> segments, std::span<const float* const> sources, float* out) {
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const TensorSegment& segment = segments[s];
    if (segment.numel) {
      std::memcpy(out + segment.offset, sources[s] + segment.start, segment.numel * sizeof(float));
    }
  }
}

void scatter_segments(std::span<const TensorSegment> segments, const float* in, std::span<float* const> targets) {
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const TensorSegment& segment = segments[s];
    if (segment.numel && targets[s]) {
      std::memcpy(targets[s] + segment.start, in + segment.offset, segment.numel * sizeof(float));
    }
  }
}

}  // namespace gradcomp
