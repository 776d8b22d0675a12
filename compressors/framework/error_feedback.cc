#include "compressors/framework/error_feedback.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "compressors/cuda/cuda_path.h"
#include "compressors/framework/ef_flow.h"
#include "compressors/framework/float_views.h"
#include "compressors/framework/segmented_payload.h"
#include "compressors/framework/segments.h"
#include "compressors/framework/state_io.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/half_ops.cuh"

namespace gradcomp {
namespace {

// Counts non-finite values; `first` receives the smallest such index (n when none).
std::size_t count_nonfinite(const float* values, std::size_t n, int threads, std::size_t& first) {
  const std::size_t chunks = (n + kernels::kParallelChunk - 1) / kernels::kParallelChunk;
  std::vector<std::size_t> counts(chunks, 0), firsts(chunks, n);
  kernels::parallel_chunks(n, kernels::kParallelChunk, threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
    std::size_t count = 0;
    for (std::size_t i = begin; i < end; ++i) count += !std::isfinite(values[i]);
    counts[k] = count;
    if (count) {
      for (std::size_t i = begin; i < end; ++i) {
        if (!std::isfinite(values[i])) {
          firsts[k] = i;
          break;
        }
      }
    }
  });
  std::size_t total = 0;
  first = n;
  for (std::size_t k = 0; k < chunks; ++k) {
    total += counts[k];
    first = std::min(first, firsts[k]);
  }
  return total;
}

}  // namespace

void to_float(const TensorView& view, float* out) {
  const auto* bits = static_cast<const std::uint16_t*>(view.data());
  if (view.dtype() == DType::kF16) {
    for (std::size_t i = 0; i < view.numel(); ++i) out[i] = kernels::half_bits_to_float(bits[i]);
  } else {
    for (std::size_t i = 0; i < view.numel(); ++i) out[i] = kernels::bf16_bits_to_float(bits[i]);
  }
}

void to_float(const TensorView& view, std::vector<float>& out) {
  out.resize(view.numel());
  to_float(view, out.data());
}

void from_float(const std::vector<float>& values, const TensorView& view) {
  auto* bits = static_cast<std::uint16_t*>(view.data());
  if (view.dtype() == DType::kF16) {
    for (std::size_t i = 0; i < view.numel(); ++i) bits[i] = kernels::float_to_half_bits(values[i]);
  } else {
    for (std::size_t i = 0; i < view.numel(); ++i) bits[i] = kernels::float_to_bf16_bits(values[i]);
  }
}

void check_float_dtype(const TensorView& view, std::string_view codec, std::string_view what) {
  GRADCOMP_CHECK(view.dtype() == DType::kF32 || view.dtype() == DType::kF16 || view.dtype() == DType::kBF16,
                 "compressor '{}': {} must be f32, f16 or bf16, got {}", codec, what, view.describe());
}

std::vector<ParamSpec> lossless_common_params() {
  return {ParamSpec{"nonfinite", ParamSpec::Kind::kChoice, "raise", 0, 0, false, {"raise", "skip", "pass"},
                    "NaN/Inf in a gradient: raise naming the tensor, skip (send zeros), or pass through"}};
}

NonFinitePolicy parse_nonfinite_policy(const std::string& text) {
  if (text == "skip") return NonFinitePolicy::kSkip;
  if (text == "pass") return NonFinitePolicy::kPass;
  return NonFinitePolicy::kRaise;
}

std::vector<ParamSpec> lossy_common_params() {
  auto params = lossless_common_params();
  params.insert(params.begin(), ParamSpec{"ef", ParamSpec::Kind::kBool, "on", 0, 0, false, {},
                                          "error feedback: keep what compression dropped and add it next step"});
  return params;
}

ErrorFeedbackCompressor::ErrorFeedbackCompressor(std::string name, payload::CodecId codec, CompressorTraits traits,
                                                 std::vector<ParamSpec> param_specs, Params params)
    : name_(std::move(name)),
      codec_(codec),
      traits_(traits),
      param_specs_(std::move(param_specs)),
      params_(std::move(params)) {
  ef_ = params_.has("ef") && params_.get_bool("ef");
  nonfinite_ = params_.has("nonfinite") ? parse_nonfinite_policy(params_.get_string("nonfinite")) : NonFinitePolicy::kRaise;
}

ErrorFeedbackCompressor::~ErrorFeedbackCompressor() = default;

std::string ErrorFeedbackCompressor::spec() const { return params_.canonical(param_specs_); }

std::size_t ErrorFeedbackCompressor::payload_bound(std::size_t numel, std::span<const TensorSegment> segments) const {
  if (segments.size() <= 1 || traits_.summable) return max_payload_bytes(numel);
  std::vector<std::size_t> parts;
  parts.reserve(segments.size());
  for (const TensorSegment& segment : segments) parts.push_back(max_payload_bytes(segment.numel));
  return payload::segmented_bound(parts);
}

// The host memory space of compress_segments(): each segment's gradient as f32 values (values[s]; a laid-out
// tensor's, or the parts of compress_parts()), the states' vectors, host output.
class ErrorFeedbackCompressor::HostStore final : public SegmentStore {
 public:
  HostStore(ErrorFeedbackCompressor& owner, std::span<const float* const> values, const FlowCall& call, bool fused)
      : owner_(owner), values_(values), call_(call), fused_(fused) {}

  bool counts_in_encode() const override { return fused_; }
  std::size_t scan(std::size_t s, std::size_t& first) override {
    const TensorSegment& segment = call_.segments[s];
    return count_nonfinite(values_[s], segment.numel, owner_.threads_, first);
  }
  std::pair<std::size_t, float> first_nonfinite(std::size_t s, std::size_t first) override {
    return {first, values_[s][first]};
  }
  std::size_t encode(std::size_t s, bool zero, std::span<std::byte> slot, CompressStats& stats,
                     std::size_t& first) override {
    const TensorSegment& segment = call_.segments[s];
    return owner_.encode_segment(values_[s], segment, *call_.states[s], *call_.ctx, call_.dtype, zero,
                                 fused_ && !zero, slot, stats, first);
  }
  void write(std::byte* dst, std::span<const std::byte> bytes) override {
    std::memcpy(dst, bytes.data(), bytes.size());
  }
  void fill_zero(std::byte* dst, std::size_t n) override { std::memset(dst, 0, n); }
  void commit(std::size_t s, bool dirty) override {
    TensorState& state = *call_.states[s];
    if (fused_ && owner_.ef_) std::swap(state.buffers[0], state.residual_next);
    if (!dirty) return;
    for (auto& buffer : state.buffers) {  // nonfinite=pass: no NaN/Inf is kept in any state buffer
      for (float& value : buffer) {
        if (!std::isfinite(value)) value = 0.0f;
      }
    }
  }

 private:
  ErrorFeedbackCompressor& owner_;
  std::span<const float* const> values_;
  const FlowCall& call_;
  const bool fused_;
};

std::size_t ErrorFeedbackCompressor::compress(const TensorView& grad, std::span<std::byte> out,
                                              const CompressContext& ctx) {
  GRADCOMP_CHECK(!ctx.name.empty(), "compressor '{}': CompressContext.name must name the tensor", name_);
  check_float_dtype(grad, name_, fmt::format("gradient '{}'", ctx.name));
  if (grad.device().is_cuda()) require_cuda_codec(grad, ctx);
  const std::size_t n = grad.numel();
  const std::vector<TensorSegment> segments = resolve_segments(ctx, n, name_);
  const std::size_t needed = payload_bound(n, segments);
  GRADCOMP_CHECK(out.size() >= needed, "compressor '{}': output buffer for '{}' has {} bytes, {} needed", name_,
                 ctx.name, out.size(), needed);
  // Every size is checked before any state is created, so a refused call changes nothing.
  for (const TensorSegment& segment : segments) check_state_size(segment.name, segment.total, ctx.rank);
  if (grad.device().is_cuda()) return compress_cuda(grad, out, ctx, segments);
  for (const TensorSegment& segment : segments) sync_to_host(segment.name, /*drop_device=*/true);
  const float* values = static_cast<const float*>(grad.data());
  if (grad.dtype() != DType::kF32) {
    to_float(grad, scratch_in_);
    values = scratch_in_.data();
  }
  std::vector<const float*> segment_values;
  for (const TensorSegment& segment : segments) segment_values.push_back(values + segment.offset);
  return compress_host(segment_values, segments, n, grad.dtype(), out, ctx);
}

std::size_t ErrorFeedbackCompressor::compress_host(std::span<const float* const> values,
                                                   std::span<const TensorSegment> segments, std::size_t numel,
                                                   DType dtype, std::span<std::byte> out, const CompressContext& ctx) {
  std::vector<TensorState*> states;
  for (const TensorSegment& segment : segments) states.push_back(&state_for(segment.name, segment.total, ctx.rank));
  const FlowCall call{name_, codec_, traits_, nonfinite_, &ctx, segments, states, numel, dtype};
  // A codec that fuses the non-finite scan counts inside its encode and writes the new residual aside
  // (residual_next); the others (and chunks of a tensor) are scanned first.
  const bool fused = fuses_nonfinite_scan() &&
                     std::all_of(segments.begin(), segments.end(), [](const TensorSegment& s) { return is_whole(s); });
  HostStore store(*this, values, call, fused);
  return compress_segments(call, store, out, stats_);
}

std::size_t ErrorFeedbackCompressor::encode_segment(const float* values, const TensorSegment& segment,
                                                    TensorState& state, const CompressContext& ctx, DType dtype,
                                                    bool zero, bool fused, std::span<std::byte> slot,
                                                    CompressStats& stats, std::size_t& first_bad) {
  const std::size_t n = segment.numel;
  CompressContext alone = ctx;
  alone.name = segment.name;
  alone.segments = {};
  alone.step = segment_step(segment, ctx.step);
  EncodeArgs args;
  args.grad = values;
  args.numel = n;
  args.ctx = &alone;
  args.tensor_key = segment_stream_key(segment);
  args.original_dtype = dtype;
  args.threads = threads_;
  args.first_nonfinite = &first_bad;
  const std::size_t extra = extra_state_buffers();
  if (zero || !is_whole(segment)) {
    // A skipped segment (zeros against zero state) or a chunk (its range of the tensor's state): a working state.
    slice_ = TensorState{};
    slice_.numel = n;
    slice_.buffers.assign(1 + extra, {});
    slice_.scalars = state.scalars;
    for (std::size_t b = 1; b <= extra; ++b) {
      if (zero) {
        slice_.buffers[b].assign(n, 0.0f);
      } else {
        const auto from = state.buffers[b].begin() + static_cast<std::ptrdiff_t>(segment.start);
        slice_.buffers[b].assign(from, from + static_cast<std::ptrdiff_t>(n));
      }
    }
    if (zero) {
      zeros_.assign(n, 0.0f);
      args.grad = zeros_.data();
      if (ef_) slice_.buffers[0].assign(n, 0.0f);
      args.residual = ef_ ? slice_.buffers[0].data() : nullptr;
    } else {
      args.residual = ef_ ? state.buffers[0].data() + segment.start : nullptr;  // updated in place
    }
    args.state = &slice_;
    const std::size_t size = encode(args, slot, stats);
    if (!zero) {
      for (std::size_t b = 1; b <= extra; ++b) {
        std::copy(slice_.buffers[b].begin(), slice_.buffers[b].end(),
                  state.buffers[b].begin() + static_cast<std::ptrdiff_t>(segment.start));
      }
    }
    return size;
  }
  args.state = &state;
  args.residual = ef_ ? state.buffers[0].data() : nullptr;
  if (fused && ef_) {
    if (state.residual_next.size() != n) state.residual_next.assign(n, 0.0f);
    args.residual_out = state.residual_next.data();
  }
  return encode(args, slot, stats);
}

void ErrorFeedbackCompressor::validate(const payload::View&, std::size_t) const {}

void ErrorFeedbackCompressor::decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) {
  check_float_dtype(out, name_, "decompress output");
  if (out.device().is_cuda()) {
    decompress_cuda(std::span(&payload, 1), out, mode);  // the whole payload, segmented or not
    return;
  }
  require_host_payload(payload.memory, out);
  const std::span<const std::byte> bytes = payload.bytes;
  std::array<std::byte, payload::kHeaderBytes> prefix{};
  GRADCOMP_CHECK_AS(CorruptPayload, bytes.size() >= prefix.size(),
                    "corrupt payload: {} bytes is shorter than the {}-byte header", bytes.size(), prefix.size());
  read_prefix(bytes, prefix.data(), prefix.size(), out);
  const payload::Header header = payload::decode_header(prefix, bytes.size());
  if (!payload::is_segmented(header)) {
    decompress_plain(bytes, out, mode);
    return;
  }
  GRADCOMP_CHECK_AS(CorruptPayload, header.codec == codec_ && header.numel == out.numel(),
                    "corrupt segmented payload: codec {} over {} elements where '{}' over {} was expected",
                    payload::codec_name(header.codec), header.numel, name_, out.numel());
  std::vector<std::byte> table(std::min<std::size_t>(header.section_bytes[0], bytes.size()));
  read_prefix(bytes.subspan(payload::kHeaderBytes), table.data(), table.size(), out);
  const std::vector<payload::Part> parts = payload::parse_segmented(header, table, bytes.size());
  if (out.device().is_cpu()) {
    // Every part is checked before any is decoded: a corrupt part leaves the whole output untouched.
    for (const payload::Part& part : parts) {
      const auto view = payload::parse(bytes.subspan(part.offset, part.bytes), codec_, static_cast<long long>(part.numel));
      GRADCOMP_CHECK_AS(CorruptPayload, !payload::is_segmented(view.header) && view.header.dtype == header.dtype,
                        "corrupt segmented payload: a part is itself segmented or of dtype {} (the payload's is {})",
                        dtype_name(view.header.dtype), dtype_name(header.dtype));
      validate(view, part.numel);
    }
  }
  for (const payload::Part& part : parts) {
    decompress_plain(bytes.subspan(part.offset, part.bytes), out.slice(part.element_offset, part.numel), mode);
  }
}

void ErrorFeedbackCompressor::decompress_sum(std::span<const PayloadBytes> payloads, const TensorView& out,
                                             DecodeMode first) {
  if (out.device().is_cuda()) {
    check_float_dtype(out, name_, "decompress output");
    decompress_cuda(payloads, out, first);  // every payload checked before any is written, two waits in all
    return;
  }
  for (const PayloadBytes& payload : payloads) require_host_payload(payload.memory, out);  // before any is written
  Compressor::decompress_sum(payloads, out, first);
}

void ErrorFeedbackCompressor::require_host_payload(Memory memory, const TensorView& out) const {
  GRADCOMP_CHECK(memory.is_host(), "compressor '{}': a payload in {} memory cannot be decoded into {} (a CPU output "
                 "takes host payloads)", name_, device_name(memory.device), out.describe());
}

void ErrorFeedbackCompressor::decompress_plain(std::span<const std::byte> bytes, const TensorView& out,
                                               DecodeMode mode) {
  // The decoders read f32/f16/int sections in place; a payload at any byte offset of a received buffer (possible
  // for a caller's own buffers; gradcomp's collectives place payloads in 16-byte slots) is copied to aligned memory
  // first, as the CUDA path does, so no decoder ever loads through a misaligned pointer.
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % 16 != 0) {
    scratch_payload_.assign(bytes.begin(), bytes.end());  // operator new: 16-byte aligned
    bytes = std::span<const std::byte>(scratch_payload_);
  }
  const auto view = payload::parse(bytes, codec_, static_cast<long long>(out.numel()));
  GRADCOMP_CHECK_AS(CorruptPayload, !payload::is_segmented(view.header),
                    "corrupt payload: a segmented '{}' payload nested inside another", name_);
  decode_view(view, out, mode);
}

void ErrorFeedbackCompressor::decode_view(const payload::View& view, const TensorView& out, DecodeMode mode) {
  const bool accumulate = mode == DecodeMode::kAccumulate;
  if (out.dtype() == DType::kF32) {
    decode(view, static_cast<float*>(out.data()), out.numel(), accumulate);
    return;
  }
  if (accumulate) {
    to_float(out, scratch_out_);
  } else {
    scratch_out_.assign(out.numel(), 0.0f);
  }
  decode(view, scratch_out_.data(), out.numel(), accumulate);
  from_float(scratch_out_, out);
}

void ErrorFeedbackCompressor::read_prefix(std::span<const std::byte> payload, std::byte* dst, std::size_t n,
                                          const TensorView&) const {
  const std::size_t count = std::min(n, payload.size());
  if (count > 0) std::memcpy(dst, payload.data(), count);  // an empty table may have a null data()
}

#if !GRADCOMP_WITH_CUDA
// Without CUDA there is no device state; compressors/cuda/error_feedback_cuda.cc defines these in CUDA builds.

void ErrorFeedbackCompressor::sync_to_host(std::string_view, bool) const {}
void ErrorFeedbackCompressor::drop_device_states() {}

void ErrorFeedbackCompressor::require_cuda_codec(const TensorView& grad, const CompressContext& ctx) {
  throw InvalidArgument(fmt::format("compressor '{}' has no CUDA path in this build (tensor '{}' is {})", name_,
                                    ctx.name, grad.describe()));
}

std::size_t ErrorFeedbackCompressor::compress_cuda(const TensorView& grad, std::span<std::byte>,
                                                   const CompressContext& ctx, std::span<const TensorSegment>) {
  require_cuda_codec(grad, ctx);  // throws: no CUDA path in this build
  return 0;
}

void ErrorFeedbackCompressor::decompress_cuda(std::span<const PayloadBytes>, const TensorView& out, DecodeMode) {
  throw InvalidArgument(
      fmt::format("compressor '{}' has no CUDA path in this build (output is {})", name_, out.describe()));
}
#endif

}  // namespace gradcomp
