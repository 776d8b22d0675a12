// The one compress() flow of error feedback, written once for every memory space: the segments of a call each
// encoded as if alone, the non-finite policy (raise / skip / pass) per segment, the output layout (one payload, one
// dense body for summable codecs, or a segmented container), and the commit of each segment's new state with its
// step count. Where the gradient, the state buffers and the payload live (host vectors or CUDA device buffers) is
// a SegmentStore; ErrorFeedbackCompressor has one for the host (error_feedback.cc) and one for CUDA devices
// (error_feedback_cuda.cc), and nothing of this flow is repeated in either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"

namespace gradcomp {

// Where a call's new error-feedback state becomes current: the last stage of every codec's flow (the segment stores
// below, and PowerSGD's step, compressors/codecs/powersgd_step.cc).
class StateCommit {
 public:
  virtual ~StateCommit() = default;
  // Makes segment s's encoded state current (and resets its non-finite entries when `dirty`: nonfinite=pass).
  virtual void commit(std::size_t s, bool dirty) = 0;
  // Called once after every commit.
  virtual void finish(bool any_skipped) { (void)any_skipped; }
};

// The segments of one call in one memory space: their gradient values, their state buffers, the output bytes.
class SegmentStore : public StateCommit {
 public:
  // True when encode() counts the gradient's non-finite values itself (CompressStats::nonfinite) and writes the new
  // state aside, so that commit() alone makes it current; false: the flow calls scan() first, and encode() updates
  // the state in place.
  virtual bool counts_in_encode() const = 0;
  // The number of non-finite gradient values of segment s; `first` receives the index of the first (within it).
  virtual std::size_t scan(std::size_t s, std::size_t& first) = 0;
  // The first non-finite gradient value of segment s and its index, given encode()'s or scan()'s `first` (a store
  // that cannot tell the index from encode() finds it here).
  virtual std::pair<std::size_t, float> first_nonfinite(std::size_t s, std::size_t first) = 0;
  // Encodes segment s as a complete payload into `slot` (its whole room): the segment's gradient against its state,
  // or, when `zero`, a zero gradient against zero state (nonfinite=skip; the segment's state is not touched).
  // Returns the payload's size; `first` as in scan() when it counts.
  virtual std::size_t encode(std::size_t s, bool zero, std::span<std::byte> slot, CompressStats& stats,
                             std::size_t& first) = 0;
  // Writes host bytes to the output memory at `dst`, and zeroes `n` output bytes at `dst`.
  virtual void write(std::byte* dst, std::span<const std::byte> bytes) = 0;
  virtual void fill_zero(std::byte* dst, std::size_t n) = 0;
};

// The error-feedback decisions of one call's segments, written once for every codec (compress_segments() below and
// PowerSGD's step): the non-finite policy per segment and the commit of the segments that took their step.
class SegmentVerdicts {
 public:
  // The first non-finite value of a segment: its index within the segment and its value (asked only to raise).
  using Locate = std::function<std::pair<std::size_t, float>()>;

  // `segments` must outlive this object.
  SegmentVerdicts(std::string_view codec, NonFinitePolicy policy, std::span<const TensorSegment> segments);

  // `count` NaN/Inf found in segment s of a call of `ctx`: raise throws throw_nonfinite()'s message (no state has
  // changed), skip makes the segment zero (it sends zeros, its state stays), pass makes it dirty. count 0: nothing.
  void note(std::size_t s, std::size_t count, const CompressContext& ctx, const Locate& locate);
  bool zero(std::size_t s) const { return zero_[s] != 0; }
  bool dirty(std::size_t s) const { return dirty_[s] != 0; }

  // Commits every segment that was not zeroed through `store` (dirty as noted) and counts its tensor's step once
  // (in *steps[s] when the segment starts its tensor; a null entry: a segment without state); then store.finish().
  // Returns whether any segment was skipped.
  bool commit(StateCommit& store, std::span<std::uint64_t* const> steps) const;

 private:
  std::string_view codec_;
  NonFinitePolicy policy_;
  std::span<const TensorSegment> segments_;
  std::vector<char> zero_, dirty_;
};

// What the flow needs to know of the codec and the call.
struct FlowCall {
  std::string_view codec_name;
  payload::CodecId codec{};
  CompressorTraits traits;
  NonFinitePolicy policy = NonFinitePolicy::kRaise;
  const CompressContext* ctx = nullptr;
  std::span<const TensorSegment> segments;  // resolve_segments()
  std::span<TensorState* const> states;     // one per segment: steps and scalars (host memory in every space)
  std::size_t numel = 0;
  DType dtype = DType::kF32;
};

// Compresses `call` into `out` (payload_bound bytes or more, checked by the caller) through `store`; returns the
// payload size and fills `stats` (numel, nonfinite, selected, saturated, skipped, payload_bytes). Throws
// InvalidArgument under nonfinite=raise; then no segment's state (buffers, scalars or steps) has changed.
std::size_t compress_segments(const FlowCall& call, SegmentStore& store, std::span<std::byte> out,
                              CompressStats& stats);

// The nonfinite=raise error: `count` NaN/Inf in `segment` of a call of `ctx` to `codec`, the first at element
// `index` of the segment, of value `value`.
[[noreturn]] void throw_nonfinite(std::string_view codec, const CompressContext& ctx, const TensorSegment& segment,
                                  std::size_t count, std::size_t index, float value);

}  // namespace gradcomp
