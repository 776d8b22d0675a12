#include "compressors/framework/ef_flow.h"

#include <array>
#include <string>

#include <fmt/format.h>

#include "compressors/framework/segmented_payload.h"
#include "compressors/framework/segments.h"
#include "gradcomp/error.h"

namespace gradcomp {
namespace {

// One call's run through the flow: the per-segment decisions (zero = skipped, dirty = nonfinite=pass) made before
// anything is committed, and the scalars to restore when a step is not kept.
class Flow {
 public:
  Flow(const FlowCall& call, SegmentStore& store, CompressStats& stats)
      : call_(call), store_(store), stats_(stats), counts_(store.counts_in_encode()),
        verdicts_(call.codec_name, call.policy, call.segments), encoded_(call.segments.size(), 0),
        scalars_before_(call.segments.size()) {}

  // nonfinite policy before any state changes, for a store that does not count in encode().
  void scan_first() {
    if (counts_) return;
    for (std::size_t s = 0; s < call_.segments.size(); ++s) {
      std::size_t first = 0;
      const std::size_t bad = store_.scan(s, first);
      if (bad == 0) continue;
      stats_.nonfinite += bad;
      verdicts_.note(s, bad, *call_.ctx, locate(s, first));
    }
  }

  // Segment s as if alone into `slot`, the policy applied to what its encode counted.
  std::size_t encode_at(std::size_t s, std::span<std::byte> slot) {
    CompressStats part;
    std::size_t first = call_.segments[s].numel;
    if (counts_) scalars_before_[s] = call_.states[s]->scalars;
    std::size_t size = store_.encode(s, verdicts_.zero(s), slot, part, first);
    if (counts_ && part.nonfinite > 0) {
      stats_.nonfinite += part.nonfinite;
      if (call_.policy != NonFinitePolicy::kPass) {
        // The step is not kept: the codec's scalars go back (raise: every encoded segment's).
        call_.states[s]->scalars = scalars_before_[s];
        for (std::size_t t = 0; t < call_.segments.size() && call_.policy == NonFinitePolicy::kRaise; ++t) {
          if (encoded_[t]) call_.states[t]->scalars = scalars_before_[t];
        }
      }
      verdicts_.note(s, part.nonfinite, *call_.ctx, locate(s, first));
      if (verdicts_.zero(s)) {
        part = CompressStats{};
        size = store_.encode(s, true, slot, part, first);
      }
    }
    encoded_[s] = 1;
    stats_.selected += part.selected;
    stats_.saturated += part.saturated;
    return size;
  }

  // One dense body: segment s's values at their place in it. Encoded last to first, each segment's own 64-byte
  // header lands on body bytes of the segments before it (or on the call's header), written after it.
  std::size_t summable_body(std::span<std::byte> out) {
    const std::size_t wire = dtype_size(call_.traits.wire_dtype);
    for (std::size_t s = call_.segments.size(); s-- > 0;) {
      const TensorSegment& segment = call_.segments[s];
      const std::size_t bytes = payload::kHeaderBytes + segment.numel * wire;
      const std::size_t written = encode_at(s, out.subspan(segment.offset * wire, bytes));
      GRADCOMP_ASSERT(written == bytes, "summable codec '{}' wrote {} bytes for {} values", call_.codec_name, written,
                      segment.numel);
    }
    payload::Header header;
    header.codec = call_.codec;
    header.numel = call_.numel;
    header.dtype = call_.dtype;
    header.section_count = 1;
    header.section_bytes[0] = call_.numel * wire;
    std::array<std::byte, payload::kHeaderBytes> bytes{};
    payload::encode_header(header, bytes);
    store_.write(out.data(), bytes);
    return payload::total_bytes(header);
  }

  // A segmented container: each segment a complete part.
  std::size_t segmented(std::span<std::byte> out) {
    payload::SegmentedWriter writer(call_.codec, call_.numel, call_.dtype, call_.segments.size(), out.size());
    for (std::size_t s = 0; s < call_.segments.size(); ++s) {
      const std::size_t offset = writer.next_offset();
      writer.commit(call_.segments[s].numel, encode_at(s, out.subspan(offset, writer.room())));
      if (writer.padding_before()) {
        store_.fill_zero(out.data() + writer.next_offset() - writer.padding_before(), writer.padding_before());
      }
    }
    const std::vector<std::byte> prefix = writer.prefix();
    store_.write(out.data(), prefix);
    return writer.total_bytes();
  }

  // The new state of every segment that took its step; a tensor's step counts once, also when split into chunks.
  void commit() {
    std::vector<std::uint64_t*> steps(call_.segments.size());
    for (std::size_t s = 0; s < steps.size(); ++s) steps[s] = &call_.states[s]->steps;
    if (verdicts_.commit(store_, steps)) stats_.skipped = true;
  }

 private:
  SegmentVerdicts::Locate locate(std::size_t s, std::size_t first) {
    return [this, s, first] { return store_.first_nonfinite(s, first); };
  }

  const FlowCall& call_;
  SegmentStore& store_;
  CompressStats& stats_;
  const bool counts_;
  SegmentVerdicts verdicts_;
  std::vector<char> encoded_;
  std::vector<std::vector<double>> scalars_before_;
};

}  // namespace

std::size_t compress_segments(const FlowCall& call, SegmentStore& store, std::span<std::byte> out,
                              CompressStats& stats) {
  stats = CompressStats{};
  stats.numel = call.numel;
  Flow flow(call, store, stats);
  flow.scan_first();
  std::size_t size = 0;
  if (call.segments.size() == 1) {
    size = flow.encode_at(0, out);
  } else if (call.traits.summable) {
    size = flow.summable_body(out);
  } else {
    size = flow.segmented(out);
  }
  flow.commit();
  stats.payload_bytes = size;
  return size;
}

SegmentVerdicts::SegmentVerdicts(std::string_view codec, NonFinitePolicy policy, std::span<const TensorSegment> segments)
    : codec_(codec), policy_(policy), segments_(segments), zero_(segments.size(), 0), dirty_(segments.size(), 0) {}

void SegmentVerdicts::note(std::size_t s, std::size_t count, const CompressContext& ctx, const Locate& locate) {
  if (count == 0) return;
  if (policy_ == NonFinitePolicy::kRaise) {
    const auto [index, value] = locate();
    throw_nonfinite(codec_, ctx, segments_[s], count, index, value);
  }
  (policy_ == NonFinitePolicy::kSkip ? zero_ : dirty_)[s] = 1;
}

bool SegmentVerdicts::commit(StateCommit& store, std::span<std::uint64_t* const> steps) const {
  bool any_skipped = false;
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    if (zero_[s]) {
      any_skipped = true;
      continue;
    }
    store.commit(s, dirty_[s] != 0);
    if (segments_[s].start == 0 && steps[s] != nullptr) ++*steps[s];
  }
  store.finish(any_skipped);
  return any_skipped;
}

void throw_nonfinite(std::string_view codec, const CompressContext& ctx, const TensorSegment& segment,
                     std::size_t count, std::size_t index, float value) {
  const std::string inside = ctx.segments.empty() || ctx.name == segment.name
                                 ? std::string()
                                 : fmt::format(" (carried in '{}')", ctx.name);
  throw InvalidArgument(fmt::format(
      "compressor '{}': gradient '{}'{} on rank {} at step {} has {} non-finite value(s), the first at index {} "
      "({}); the error-feedback state was left untouched (use nonfinite=skip or nonfinite=pass to continue)",
      codec, segment.name, inside, ctx.rank, segment_step(segment, ctx.step), count, segment.start + index, value));
}

}  // namespace gradcomp
