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
        zero_(call.segments.size(), 0), dirty_(call.segments.size(), 0), encoded_(call.segments.size(), 0),
        scalars_before_(call.segments.size()) {}

  // nonfinite policy before any state changes, for a store that does not count in encode().
  void scan_first() {
    if (counts_) return;
    for (std::size_t s = 0; s < call_.segments.size(); ++s) {
      std::size_t first = 0;
      const std::size_t bad = store_.scan(s, first);
      if (bad == 0) continue;
      stats_.nonfinite += bad;
      if (call_.policy == NonFinitePolicy::kRaise) raise(s, bad, first);
      (call_.policy == NonFinitePolicy::kSkip ? zero_ : dirty_)[s] = 1;
    }
  }

  // Segment s as if alone into `slot`, the policy applied to what its encode counted.
  std::size_t encode_at(std::size_t s, std::span<std::byte> slot) {
    CompressStats part;
    std::size_t first = call_.segments[s].numel;
    if (counts_) scalars_before_[s] = call_.states[s]->scalars;
    std::size_t size = store_.encode(s, zero_[s], slot, part, first);
    if (counts_ && part.nonfinite > 0) {
      stats_.nonfinite += part.nonfinite;
      if (call_.policy == NonFinitePolicy::kPass) {
        dirty_[s] = 1;
      } else {
        call_.states[s]->scalars = scalars_before_[s];
        if (call_.policy == NonFinitePolicy::kRaise) {
          for (std::size_t t = 0; t < call_.segments.size(); ++t) {
            if (encoded_[t]) call_.states[t]->scalars = scalars_before_[t];
          }
          raise(s, part.nonfinite, first);
        }
        zero_[s] = 1;
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
    for (std::size_t s = 0; s < call_.segments.size(); ++s) {
      if (zero_[s]) {
        stats_.skipped = true;
        continue;
      }
      store_.commit(s, dirty_[s] != 0);
      if (call_.segments[s].start == 0) ++call_.states[s]->steps;
    }
    store_.finish(stats_.skipped);
  }

 private:
  [[noreturn]] void raise(std::size_t s, std::size_t count, std::size_t first) {
    const auto [index, value] = store_.first_nonfinite(s, first);
    throw_nonfinite(call_.codec_name, *call_.ctx, call_.segments[s], count, index, value);
  }

  const FlowCall& call_;
  SegmentStore& store_;
  CompressStats& stats_;
  const bool counts_;
  std::vector<char> zero_, dirty_, encoded_;
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
