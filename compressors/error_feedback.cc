#include "compressors/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compressors/cuda_path.h"
#include "compressors/segments.h"
#include "compressors/state_io.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/half_ops.cuh"
#include "kernels/philox_ops.cuh"

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

void to_float(const TensorView& view, std::vector<float>& out) {
  out.resize(view.numel());
  const auto* bits = static_cast<const std::uint16_t*>(view.data());
  if (view.dtype() == DType::kF16) {
    for (std::size_t i = 0; i < view.numel(); ++i) out[i] = kernels::half_bits_to_float(bits[i]);
  } else {
    for (std::size_t i = 0; i < view.numel(); ++i) out[i] = kernels::bf16_bits_to_float(bits[i]);
  }
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

}  // namespace

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

void ErrorFeedbackCompressor::reset_state() {
  drop_device_states();
  states_.clear();
  resident_.clear();
  resident_in_.clear();
}

std::string ErrorFeedbackCompressor::spec() const { return params_.canonical(param_specs_); }

const TensorState* ErrorFeedbackCompressor::state_of(std::string_view name) const {
  materialize(name);
  sync_to_host(name, /*drop_device=*/false);
  const auto it = states_.find(name);
  return it == states_.end() ? nullptr : &it->second;
}

std::map<std::string, std::size_t> ErrorFeedbackCompressor::state_sizes() const {
  std::map<std::string, std::size_t> sizes;
  for (const auto& [name, state] : states_) sizes.emplace(name, state.numel);
  return sizes;
}

TensorState& ErrorFeedbackCompressor::state_for(std::string_view name, std::size_t numel, int rank) {
  auto it = states_.find(name);
  if (it != states_.end()) {
    GRADCOMP_CHECK(it->second.numel == numel,
                   "compressor '{}': tensor '{}' on rank {} has {} elements but its saved state has {} (did its shape "
                   "change, or was state of another model loaded?)",
                   name_, name, rank, numel, it->second.numel);
    return it->second;
  }
  TensorState state;
  state.numel = numel;
  state.buffers.resize(1 + extra_state_buffers());
  if (ef_) state.buffers[0].assign(numel, 0.0f);
  for (std::size_t b = 1; b < state.buffers.size(); ++b) state.buffers[b].assign(numel, 0.0f);
  return states_.emplace(std::string(name), std::move(state)).first->second;
}

std::size_t ErrorFeedbackCompressor::compress(const TensorView& grad, std::span<std::byte> out,
                                              const CompressContext& ctx) {
  GRADCOMP_CHECK(!ctx.name.empty(), "compressor '{}': CompressContext.name must name the tensor", name_);
  if (grad.device().is_cuda()) return compress_cuda(grad, out, ctx);
  check_float_dtype(grad, name_, fmt::format("gradient '{}'", ctx.name));
  const std::size_t n = grad.numel();
  const std::size_t needed = max_payload_bytes(n);
  GRADCOMP_CHECK(out.size() >= needed, "compressor '{}': output buffer for '{}' has {} bytes, {} needed", name_,
                 ctx.name, out.size(), needed);
  const std::vector<TensorSegment> segments = resolve_segments(ctx, n, name_);
  // Several whole tensors: their state may stay resident in one block between calls (resident_work).
  bool resident = segments.size() > 1;
  for (const TensorSegment& segment : segments) {
    resident = resident && segment.start == 0 && (segment.total == 0 || segment.total == segment.numel);
  }
  for (const TensorSegment& segment : segments) {
    if (!resident) materialize(segment.name);
    sync_to_host(segment.name, /*drop_device=*/true);
  }

  const float* values = nullptr;
  if (grad.dtype() == DType::kF32) {
    values = static_cast<const float*>(grad.data());
  } else {
    to_float(grad, scratch_in_);
    values = scratch_in_.data();
  }

  stats_ = CompressStats{};
  stats_.numel = n;
  // Every size is checked before any state is created, so a refused call changes nothing.
  for (const TensorSegment& segment : segments) check_state_size(segment.name, segment.total, ctx.rank);
  std::vector<TensorState*> states;
  for (const TensorSegment& segment : segments) states.push_back(&state_for(segment.name, segment.total, ctx.rank));
  // One named tensor carried whole works on its own state; anything else on a gathered copy.
  const bool whole = carried_whole(segments);
  if (!whole && segments.size() == 1 && extra_state_buffers() == 0) {
    // Part of one tensor (a scatter-reduce-allgather chunk): encode in place on its range of the tensor's state,
    // no gather and scatter; only a gradient holding NaN/Inf takes the general path below (one read pass to know).
    const std::size_t size = encode_slice(values, grad.dtype(), n, segments[0], *states[0], ctx, out);
    if (size != kNotEncoded) return size;
  }
  TensorState& work = whole      ? *states[0]
                      : resident ? resident_work(segments, states, ctx.name)
                                 : gather_state(segments, states, ctx.name);

  EncodeArgs args;
  args.grad = values;
  args.residual = ef_ ? work.buffers[0].data() : nullptr;
  args.numel = n;
  args.ctx = &ctx;
  args.state = &work;
  args.tensor_key = kernels::fnv1a64(ctx.name.data(), ctx.name.size());
  args.original_dtype = grad.dtype();
  args.threads = threads_;
  std::size_t first_bad = n;

  std::size_t size = 0;
  if (fuses_nonfinite_scan()) {
    // Fused path: encode() scans the gradient in its own pass and writes the new residual into the second buffer,
    // so the policy is applied afterwards and raise/skip simply discard what encode() wrote.
    GRADCOMP_ASSERT(extra_state_buffers() == 0, "compressor '{}' fuses the non-finite scan but keeps extra buffers",
                    name_);
    if (ef_) {
      if (work.residual_next.size() != n) work.residual_next.assign(n, 0.0f);
      args.residual_out = work.residual_next.data();
    }
    args.first_nonfinite = &first_bad;
    const std::vector<double> scalars_before = work.scalars;
    size = encode(args, out, stats_);
    if (stats_.nonfinite > 0 && nonfinite_ != NonFinitePolicy::kPass) {
      work.scalars = scalars_before;
      if (nonfinite_ == NonFinitePolicy::kRaise) throw_nonfinite(ctx, segments, values, first_bad);
      if (resident) leave_residency(segments, args);
      return encode_skipping(args, segments, states, out);
    }
    if (ef_) std::swap(work.buffers[0], work.residual_next);
  } else {
    stats_.nonfinite = count_nonfinite(values, n, threads_, first_bad);
    if (stats_.nonfinite > 0) {
      if (nonfinite_ == NonFinitePolicy::kRaise) throw_nonfinite(ctx, segments, values, first_bad);
      if (nonfinite_ == NonFinitePolicy::kSkip) {
        if (resident) leave_residency(segments, args);
        return encode_skipping(args, segments, states, out);
      }
    }
    size = encode(args, out, stats_);
  }
  if (stats_.nonfinite > 0) {  // nonfinite=pass: no NaN/Inf is kept in any state buffer
    for (auto& buffer : work.buffers) {
      for (float& value : buffer) {
        if (!std::isfinite(value)) value = 0.0f;
      }
    }
  }
  if (resident) {
    call_scalars_.insert_or_assign(std::string(ctx.name), work.scalars);  // the block stays: nothing to scatter
  } else if (!whole) {
    scatter_state(segments, states, std::vector<bool>(segments.size(), true));
    call_scalars_.insert_or_assign(std::string(ctx.name), work_.scalars);
  }
  for (std::size_t s = 0; s < segments.size(); ++s) {
    if (segments[s].start == 0) ++states[s]->steps;  // once per step, also when a tensor is split into chunks
  }
  stats_.payload_bytes = size;
  return size;
}


std::size_t ErrorFeedbackCompressor::encode_slice(const float* values, DType dtype, std::size_t n,
                                                  const TensorSegment& segment, TensorState& state,
                                                  const CompressContext& ctx, std::span<std::byte> out) {
  std::size_t first_bad = n;
  if (count_nonfinite(values, n, threads_, first_bad) > 0) return kNotEncoded;
  work_.numel = n;
  work_.buffers.assign(1, {});
  const auto scalars = call_scalars_.find(ctx.name);
  work_.scalars = scalars == call_scalars_.end() ? std::vector<double>{} : scalars->second;
  EncodeArgs args;
  args.grad = values;
  args.residual = ef_ ? state.buffers[0].data() + segment.start : nullptr;  // updated in place
  args.numel = n;
  args.ctx = &ctx;
  args.state = &work_;
  args.tensor_key = kernels::fnv1a64(ctx.name.data(), ctx.name.size());
  args.original_dtype = dtype;
  args.threads = threads_;
  std::size_t ignored = n;
  args.first_nonfinite = &ignored;
  const std::size_t size = encode(args, out, stats_);
  stats_.nonfinite = 0;
  stats_.payload_bytes = size;
  call_scalars_.insert_or_assign(std::string(ctx.name), work_.scalars);
  if (segment.start == 0) ++state.steps;
  return size;
}


void ErrorFeedbackCompressor::throw_nonfinite(const CompressContext& ctx, std::span<const TensorSegment> segments,
                                              const float* values, std::size_t first_bad) const {
  const TensorSegment& segment = segments[segment_of(segments, first_bad)];
  const std::string inside =
      ctx.segments.empty() ? std::string() : fmt::format(" (carried in '{}')", ctx.name);
  throw InvalidArgument(fmt::format(
      "compressor '{}': gradient '{}'{} on rank {} at step {} has {} non-finite value(s), the first at index {} "
      "({}); the error-feedback state was left untouched (use nonfinite=skip or nonfinite=pass to continue)",
      name_, segment.name, inside, ctx.rank, ctx.step, stats_.nonfinite,
      segment.start + (first_bad - segment.offset), values[first_bad]));
}

std::size_t ErrorFeedbackCompressor::encode_skipping(EncodeArgs args, std::span<const TensorSegment> segments,
                                                     const std::vector<TensorState*>& states,
                                                     std::span<std::byte> out) {
  // nonfinite=skip: every segment holding NaN/Inf is sent as zeros (gradient and state both zero in the encode) and
  // keeps its state exactly; the other segments of the call take their step as usual. Works on a gathered copy.
  const std::size_t n = args.numel;
  const std::string_view call = args.ctx->name;
  std::vector<bool> keep(segments.size(), true);
  masked_.assign(args.grad, args.grad + n);
  TensorState& work = gather_state(segments, states, call);
  if (args.state != &work_) work.scalars = args.state->scalars;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const TensorSegment& segment = segments[s];
    const float* begin = masked_.data() + segment.offset;
    keep[s] = std::all_of(begin, begin + segment.numel, [](float v) { return std::isfinite(v); });
    if (keep[s]) continue;
    std::fill_n(masked_.data() + segment.offset, segment.numel, 0.0f);
    for (auto& buffer : work.buffers) {
      if (!buffer.empty()) std::fill_n(buffer.data() + segment.offset, segment.numel, 0.0f);
    }
  }
  args.grad = masked_.data();
  args.state = &work;
  args.residual = ef_ ? work.buffers[0].data() : nullptr;
  args.residual_out = nullptr;
  std::size_t ignored_first = n;
  args.first_nonfinite = &ignored_first;
  const std::size_t nonfinite = stats_.nonfinite;
  const std::size_t size = encode(args, out, stats_);
  stats_.nonfinite = nonfinite;  // a fusing codec counted the zeros
  stats_.skipped = true;
  stats_.payload_bytes = size;
  scatter_state(segments, states, keep);  // codec scalars (diagnostics) of a skipped step are not kept
  for (std::size_t s = 0; s < segments.size(); ++s) {
    if (keep[s] && segments[s].start == 0) ++states[s]->steps;
  }
  return size;
}

void ErrorFeedbackCompressor::decompress(std::span<const std::byte> bytes, const TensorView& out, DecodeMode mode) {
  if (out.device().is_cuda()) {
    decompress_cuda(bytes, out, mode);
    return;
  }
  check_float_dtype(out, name_, "decompress output");
  const auto view = payload::parse(bytes, codec_, static_cast<long long>(out.numel()));
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

#if !GRADCOMP_WITH_CUDA
// Without CUDA there is no device state; compressors/error_feedback_cuda.cc defines these in CUDA builds.
void ErrorFeedbackCompressor::sync_to_host(std::string_view, bool) const {}
void ErrorFeedbackCompressor::drop_device_states() {}

std::size_t ErrorFeedbackCompressor::compress_cuda(const TensorView& grad, std::span<std::byte>,
                                                   const CompressContext& ctx) {
  throw InvalidArgument(fmt::format("compressor '{}' has no CUDA path in this build (tensor '{}' is {})", name_,
                                    ctx.name, grad.describe()));
}

void ErrorFeedbackCompressor::decompress_cuda(std::span<const std::byte>, const TensorView& out, DecodeMode) {
  throw InvalidArgument(
      fmt::format("compressor '{}' has no CUDA path in this build (output is {})", name_, out.describe()));
}
#endif

std::vector<std::byte> ErrorFeedbackCompressor::save_state() const {
  materialize_all();
  sync_to_host({}, /*drop_device=*/false);
  ByteWriter writer;
  write_state_envelope(writer, name_, states_.size());
  for (const auto& [tensor, state] : states_) {
    write_state_record(writer, tensor, state.numel, state.steps, state.buffers, state.scalars);
  }
  return writer.take();
}

void ErrorFeedbackCompressor::load_state(std::span<const std::byte> bytes) {
  ByteReader reader(bytes, fmt::format("'{}' compressor state", name_));
  const auto count = read_state_envelope(reader, name_);
  std::map<std::string, TensorState, std::less<>> loaded;
  for (std::uint64_t t = 0; t < count; ++t) {
    StateRecord record = read_state_record(reader);
    const std::string& tensor = record.name;
    TensorState state;
    state.numel = record.numel;
    state.steps = record.steps;
    const std::size_t buffers = record.buffers.size();
    GRADCOMP_CHECK(buffers == 1 + extra_state_buffers(),
                   "state of tensor '{}' has {} buffers; compressor '{}' keeps {}", tensor, buffers, name_,
                   1 + extra_state_buffers());
    state.buffers = std::move(record.buffers);
    for (std::size_t b = 0; b < buffers; ++b) {
      const std::size_t expected = (b == 0 && !ef_) ? 0 : state.numel;
      if (b == 0 && ef_ && state.buffers[0].empty()) state.buffers[0].assign(state.numel, 0.0f);  // saved with ef=off
      if (b == 0 && !ef_) state.buffers[0].clear();  // ef=off now: the residual is dropped
      GRADCOMP_CHECK(state.buffers[b].size() == (b == 0 && !ef_ ? 0 : state.numel),
                     "state of tensor '{}' buffer {} has {} values, expected {}", tensor, b, state.buffers[b].size(),
                     expected);
    }
    state.scalars = std::move(record.scalars);
    loaded.emplace(std::move(record.name), std::move(state));
  }
  GRADCOMP_CHECK_AS(CorruptPayload, reader.at_end(), "corrupt compressor state: {} trailing bytes", reader.remaining());
  drop_device_states();
  resident_.clear();
  resident_in_.clear();
  states_ = std::move(loaded);
}

}  // namespace gradcomp
