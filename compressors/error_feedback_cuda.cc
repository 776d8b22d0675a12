// The CUDA path of ErrorFeedbackCompressor: device-resident state per tensor name, a per-device workspace grown once,
// f16/bf16 conversion, the non-finite policy, and host <-> device coherence of the state. The codec-specific part
// is a CudaCodec (compressors/cuda_codec.h).
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compressors/cuda_path.h"
#include "compressors/error_feedback.h"
#include "compressors/segments.h"
#include "gradcomp/error.h"
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/philox_ops.cuh"

namespace gradcomp {
namespace {

void check_float_dtype(const TensorView& view, std::string_view codec, std::string_view what) {
  GRADCOMP_CHECK(view.dtype() == DType::kF32 || view.dtype() == DType::kF16 || view.dtype() == DType::kBF16,
                 "compressor '{}': {} must be f32, f16 or bf16, got {}", codec, what, view.describe());
}

// True when `pointer` can be read by a kernel on the current device (device or managed memory).
bool is_device_memory(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

constexpr std::size_t kCounterBytes = 256;  // DeviceCounters, then the decode error flag at offset 128

// Marks the end of this call's use of the per-device scratch when the call leaves, by return or by exception, so
// the next call on another stream waits for the kernels this one queued.
class ScratchUse {
 public:
  ScratchUse(DeviceScratch& scratch, cudaStream_t stream) : scratch_(scratch), stream_(stream) {
    scratch_.released.order_before(stream_);
  }
  ~ScratchUse() {
    try {
      scratch_.released.record(stream_);
    } catch (...) {  // a failing CUDA context: the error that got us here is the one to report
    }
  }
  ScratchUse(const ScratchUse&) = delete;
  ScratchUse& operator=(const ScratchUse&) = delete;

 private:
  DeviceScratch& scratch_;
  cudaStream_t stream_;
};

}  // namespace

void write_header_device(const payload::Header& header, std::byte* out, cudaStream_t stream) {
  std::array<std::byte, payload::kHeaderBytes> bytes{};
  payload::encode_header(header, bytes);
  kernels::launch_write_bytes(out, bytes.data(), bytes.size(), stream);
  for (std::size_t i = 0; i + 1 < header.section_count; ++i) {
    const std::size_t end = payload::section_offset(header, i) + header.section_bytes[i];
    const std::size_t pad = payload::align_up(header.section_bytes[i]) - header.section_bytes[i];
    if (pad) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out + end, 0, pad, stream));
  }
}

void ErrorFeedbackCompressor::sync_to_host(std::string_view name, bool drop_device) const {
  if (!cuda_) return;
  auto copy_back = [&](const std::string& tensor, DeviceTensorState& dstate) {
    if (!dstate.device_newer) return;
    auto it = states_.find(tensor);
    GRADCOMP_ASSERT(it != states_.end(), "device state of '{}' has no host state", tensor);
    kernels::DeviceGuard guard(dstate.device);
    // The last compress may still run on a non-blocking user stream (nonfinite=pass resets the state after that
    // call's synchronization), which cudaMemcpy on the legacy stream would not wait for.
    dstate.written.wait_host();
    for (std::size_t b = 0; b < dstate.current.size(); ++b) {
      auto& host = it->second.buffers[b];
      if (!dstate.current[b].data()) {
        host.clear();
        continue;
      }
      host.resize(dstate.numel);
      GRADCOMP_CUDA_CHECK(cudaMemcpy(host.data(), dstate.current[b].data(), dstate.numel * sizeof(float),
                                     cudaMemcpyDeviceToHost));
    }
    dstate.device_newer = false;
  };
  if (name.empty()) {
    for (auto& [tensor, dstate] : cuda_->states) copy_back(tensor, dstate);
    if (drop_device) cuda_->states.clear();
    return;
  }
  auto it = cuda_->states.find(name);
  if (it == cuda_->states.end()) return;
  copy_back(it->first, it->second);
  if (drop_device) cuda_->states.erase(it);
}

void ErrorFeedbackCompressor::drop_device_states() {
  if (cuda_) cuda_->states.clear();
}

DeviceTensorState& ErrorFeedbackCompressor::device_state_for(std::string_view name, std::size_t numel, int device,
                                                             void* stream_handle, int rank) {
  auto stream = static_cast<cudaStream_t>(stream_handle);
  materialize(name);  // a host call's resident block goes back to the tensors' own states first
  // Host state (steps, scalars; float buffers stay empty while the device holds them) and device state.
  auto host_it = states_.find(name);
  if (host_it == states_.end()) {
    TensorState fresh;
    fresh.numel = numel;
    fresh.buffers.resize(1 + extra_state_buffers());
    host_it = states_.emplace(std::string(name), std::move(fresh)).first;
  }
  TensorState& state = host_it->second;
  GRADCOMP_CHECK(state.numel == numel,
                 "compressor '{}': tensor '{}' on rank {} has {} elements but its saved state has {} (did its shape "
                 "change, or was state of another model loaded?)",
                 name_, name, rank, numel, state.numel);
  auto dev_it = cuda_->states.find(name);
  if (dev_it != cuda_->states.end() && dev_it->second.device != device) {
    sync_to_host(name, /*drop_device=*/true);  // the tensor moved to another GPU
    dev_it = cuda_->states.end();
  }
  if (dev_it == cuda_->states.end()) {
    DeviceTensorState dstate;
    dstate.device = device;
    dstate.numel = numel;
    const std::size_t count = 1 + extra_state_buffers();
    dstate.current.resize(count);
    dstate.next.resize(count);
    for (std::size_t b = 0; b < count; ++b) {
      if (b == 0 && !ef_) continue;
      const std::size_t bytes = std::max<std::size_t>(numel, 1) * sizeof(float);
      dstate.current[b].reserve(bytes);
      dstate.next[b].reserve(bytes);
      const auto& host = state.buffers[b];
      if (host.size() == numel && numel > 0) {
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dstate.current[b].data(), host.data(), numel * sizeof(float),
                                            cudaMemcpyHostToDevice, stream));
      } else {
        GRADCOMP_CUDA_CHECK(cudaMemsetAsync(dstate.current[b].data(), 0, numel * sizeof(float), stream));
      }
    }
    // The device now holds the authoritative copy (the host's may be empty).
    dstate.device_newer = true;
    dev_it = cuda_->states.emplace(std::string(name), std::move(dstate)).first;
  }
  DeviceTensorState& dstate = dev_it->second;
  dstate.written.order_before(stream);  // the last compress of this tensor may have run on another stream
  return dstate;
}

std::size_t ErrorFeedbackCompressor::compress_cuda(const TensorView& grad, std::span<std::byte> out,
                                                   const CompressContext& ctx) {
  check_float_dtype(grad, name_, fmt::format("gradient '{}'", ctx.name));
  if (!cuda_) {
    cuda_ = std::make_unique<CudaPath>();
    cuda_->codec = make_cuda_codec(codec_, params_);
  }
  GRADCOMP_CHECK(cuda_->codec != nullptr, "compressor '{}' has no CUDA path (tensor '{}' is {})", name_, ctx.name,
                 grad.describe());
  const std::size_t n = grad.numel();
  const std::size_t needed = max_payload_bytes(n);
  GRADCOMP_CHECK(out.size() >= needed, "compressor '{}': output buffer for '{}' has {} bytes, {} needed", name_,
                 ctx.name, out.size(), needed);
  const int device = grad.device().index;
  kernels::DeviceGuard guard(device);
  GRADCOMP_CHECK(n == 0 || is_device_memory(grad.data()),
                 "compressor '{}': gradient '{}' is labelled {} but its memory is not CUDA device memory", name_,
                 ctx.name, grad.describe());
  GRADCOMP_CHECK(is_device_memory(out.data()),
                 "compressor '{}': the payload buffer for CUDA tensor '{}' must be device memory on cuda:{}", name_,
                 ctx.name, device);
  auto stream = static_cast<cudaStream_t>(grad.stream());
  CudaCodec& codec = *cuda_->codec;

  // The segments' states (one segment carried whole works on its own state; anything else on a gathered copy).
  const std::vector<TensorSegment> segments = resolve_segments(ctx, n, name_);
  for (const TensorSegment& segment : segments) check_state_size(segment.name, segment.total, ctx.rank);
  std::vector<DeviceTensorState*> dstates;
  std::vector<TensorState*> hstates;
  for (const TensorSegment& segment : segments) {
    dstates.push_back(&device_state_for(segment.name, segment.total, device, stream, ctx.rank));
    hstates.push_back(&states_.find(segment.name)->second);
  }
  // A whole tensor works on its own state in place; anything else (and a skipped step) on a gathered copy.
  bool in_place = carried_whole(segments);
  const std::size_t buffer_count = 1 + extra_state_buffers();
  DeviceTensorState* work = in_place ? dstates[0] : &cuda_->work[device];
  TensorState& state = in_place ? *hstates[0] : work_;
  auto gather = [&](const std::vector<bool>& zero) {
    work = &cuda_->work[device];
    work->written.order_before(stream);  // the last call's commit copies may still read it on another stream
    work->device = device;
    work->numel = n;
    work->current.resize(buffer_count);
    work->next.resize(buffer_count);
    for (std::size_t b = 0; b < buffer_count; ++b) {
      if (b == 0 && !ef_) continue;
      const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(float);
      work->current[b].reserve(bytes);
      work->next[b].reserve(bytes);
      for (std::size_t s = 0; s < segments.size(); ++s) {
        auto* to = work->current[b].as<float>() + segments[s].offset;
        const std::size_t count = segments[s].numel * sizeof(float);
        if (zero[s]) {
          GRADCOMP_CUDA_CHECK(cudaMemsetAsync(to, 0, count, stream));
        } else {
          GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(to, dstates[s]->current[b].as<const float>() + segments[s].start, count,
                                              cudaMemcpyDeviceToDevice, stream));
        }
      }
    }
  };
  if (!in_place) {
    gather(std::vector<bool>(segments.size(), false));
    const auto scalars = call_scalars_.find(ctx.name);
    work_.scalars = scalars == call_scalars_.end() ? std::vector<double>{} : scalars->second;
  }

  DeviceScratch& scratch = cuda_->scratch[device];
  const ScratchUse scratch_use(scratch, stream);
  scratch.counters.reserve(kCounterBytes);
  scratch.workspace.reserve(std::max<std::size_t>(codec.workspace_bytes(n), 256));
  const float* values = static_cast<const float*>(grad.data());
  if (grad.dtype() != DType::kF32) {
    scratch.values.reserve(std::max<std::size_t>(n, 1) * sizeof(float));
    kernels::launch_half_to_float(static_cast<const std::uint16_t*>(grad.data()), scratch.values.as<float>(), n,
                                  grad.dtype() == DType::kBF16, stream);
    values = scratch.values.as<float>();
  }
  auto* counters = scratch.counters.as<kernels::DeviceCounters>();

  // One encode of `input` against work's current buffers into its next buffers; returns the payload size.
  auto encode_once = [&](const float* input, CompressStats& stats) {
    std::vector<const float*> current(buffer_count, nullptr);
    std::vector<float*> next(buffer_count, nullptr);
    for (std::size_t b = 0; b < buffer_count; ++b) {
      current[b] = work->current[b].as<const float>();
      next[b] = work->next[b].as<float>();
    }
    CudaEncodeArgs args;
    args.grad = input;
    args.numel = n;
    args.ctx = &ctx;
    args.state = &state;
    args.tensor_key = kernels::fnv1a64(ctx.name.data(), ctx.name.size());  // random streams follow the call's name
    args.original_dtype = grad.dtype();
    args.buffers = current;
    args.next = next;
    args.counters = counters;
    args.workspace = scratch.workspace.data();
    args.stream = stream;
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(counters, 0, sizeof(kernels::DeviceCounters), stream));
    const std::size_t size = codec.encode(args, out.data(), stats);
    kernels::DeviceCounters host_counters{};
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&host_counters, counters, sizeof(host_counters), cudaMemcpyDeviceToHost, stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
    stats.nonfinite = host_counters.nonfinite;
    stats.saturated = std::max<std::size_t>(stats.saturated, host_counters.saturated);
    return size;
  };

  stats_ = CompressStats{};
  stats_.numel = n;
  const std::vector<double> scalars_before = state.scalars;
  std::size_t size = encode_once(values, stats_);
  std::vector<bool> keep(segments.size(), true);
  if (stats_.nonfinite > 0 && nonfinite_ != NonFinitePolicy::kPass) {
    state.scalars = scalars_before;
    std::vector<float> host(n);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), values, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (nonfinite_ == NonFinitePolicy::kRaise) {
      const auto bad = std::find_if(host.begin(), host.end(), [](float v) { return !std::isfinite(v); });
      throw_nonfinite(ctx, segments, host.data(), static_cast<std::size_t>(bad - host.begin()));
    }
    // skip: every segment holding NaN/Inf is encoded as zeros against zero state and keeps its own state (a rare
    // path: it allocates); the other segments take their step. A whole tensor switches to a gathered copy.
    std::vector<bool> zero(segments.size(), false);
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const float* begin = host.data() + segments[s].offset;
      zero[s] = !std::all_of(begin, begin + segments[s].numel, [](float v) { return std::isfinite(v); });
      keep[s] = !zero[s];
    }
    in_place = false;
    gather(zero);
    kernels::DeviceBuffer masked(std::max<std::size_t>(n, 1) * sizeof(float));
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(masked.data(), values, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    for (std::size_t s = 0; s < segments.size(); ++s) {
      if (zero[s]) {
        GRADCOMP_CUDA_CHECK(cudaMemsetAsync(masked.as<float>() + segments[s].offset, 0,
                                            segments[s].numel * sizeof(float), stream));
      }
    }
    const std::size_t nonfinite = stats_.nonfinite;
    CompressStats skipped_stats;
    skipped_stats.numel = n;
    size = encode_once(masked.as<const float>(), skipped_stats);
    skipped_stats.nonfinite = nonfinite;
    skipped_stats.skipped = true;
    stats_ = skipped_stats;
    state.scalars = scalars_before;  // diagnostics of a skipped step are not kept
  } else if (stats_.nonfinite > 0) {  // pass: no NaN/Inf stays in any state buffer
    for (std::size_t b = 0; b < buffer_count; ++b) {
      if (work->next[b].data()) kernels::launch_zero_nonfinite(work->next[b].as<float>(), n, stream);
    }
  }

  // Commit: the new state of every kept segment.
  if (in_place) {
    for (std::size_t b = 0; b < buffer_count; ++b) {
      if (work->next[b].data()) work->current[b].swap(work->next[b]);
    }
  } else {
    for (std::size_t b = 0; b < buffer_count; ++b) {
      if (!work->next[b].data()) continue;
      for (std::size_t s = 0; s < segments.size(); ++s) {
        if (!keep[s] || segments[s].numel == 0) continue;
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dstates[s]->current[b].as<float>() + segments[s].start,
                                            work->next[b].as<const float>() + segments[s].offset,
                                            segments[s].numel * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      }
    }
    work->written.record(stream);
    if (!stats_.skipped && !carried_whole(segments)) {
      call_scalars_.insert_or_assign(std::string(ctx.name), work_.scalars);
    }
  }
  for (std::size_t s = 0; s < segments.size(); ++s) {
    if (!keep[s]) continue;
    dstates[s]->device_newer = true;
    dstates[s]->written.record(stream);
    if (segments[s].start == 0) ++hstates[s]->steps;
  }
  stats_.payload_bytes = size;
  return size;
}

void ErrorFeedbackCompressor::decompress_cuda(std::span<const std::byte> bytes, const TensorView& out,
                                              DecodeMode mode) {
  check_float_dtype(out, name_, "decompress output");
  if (!cuda_) {
    cuda_ = std::make_unique<CudaPath>();
    cuda_->codec = make_cuda_codec(codec_, params_);
  }
  GRADCOMP_CHECK(cuda_->codec != nullptr, "compressor '{}' has no CUDA path (output is {})", name_, out.describe());
  GRADCOMP_CHECK_AS(CorruptPayload, bytes.size() >= payload::kHeaderBytes,
                    "corrupt payload: {} bytes is shorter than the {}-byte header", bytes.size(), payload::kHeaderBytes);
  const int device = out.device().index;
  kernels::DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(out.stream());
  DeviceScratch& scratch = cuda_->scratch[device];
  const ScratchUse scratch_use(scratch, stream);
  const std::size_t n = out.numel();

  // The payload may be host memory (e.g. received by MPI into a host buffer): stage it on the device, and read the
  // header from the host copy (no synchronization). A device payload's header is read back (one synchronization).
  const std::byte* device_bytes = bytes.data();
  std::array<std::byte, payload::kHeaderBytes> prefix{};
  if (!is_device_memory(bytes.data())) {
    scratch.staging.reserve(bytes.size());
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(scratch.staging.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream));
    device_bytes = scratch.staging.as<const std::byte>();
    std::memcpy(prefix.data(), bytes.data(), prefix.size());
  } else {
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(prefix.data(), device_bytes, prefix.size(), cudaMemcpyDeviceToHost, stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  payload::View view;
  view.header = payload::decode_header(prefix, bytes.size());
  GRADCOMP_CHECK_AS(CorruptPayload, view.header.codec == codec_,
                    "corrupt payload: codec {} ({}) where {} ({}) was expected",
                    payload::codec_name(view.header.codec), static_cast<int>(view.header.codec),
                    payload::codec_name(codec_), static_cast<int>(codec_));
  GRADCOMP_CHECK_AS(CorruptPayload, view.header.numel == n,
                    "corrupt payload: it holds {} elements but the output tensor has {}", view.header.numel, n);
  for (std::size_t i = 0; i < view.header.section_count; ++i) {
    view.sections[i] = std::span<const std::byte>(device_bytes + payload::section_offset(view.header, i),
                                                   view.header.section_bytes[i]);
  }

  scratch.counters.reserve(kCounterBytes);
  scratch.workspace.reserve(std::max<std::size_t>(cuda_->codec->decode_workspace_bytes(n), 256));
  auto* error_flag = reinterpret_cast<int*>(scratch.counters.as<std::byte>() + 128);
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(error_flag, 0, sizeof(int), stream));

  CudaDecodeArgs args;
  args.view = &view;
  args.numel = n;
  args.accumulate = mode == DecodeMode::kAccumulate;
  args.error_flag = error_flag;
  args.workspace = scratch.workspace.data();
  args.stream = stream;
  if (out.dtype() == DType::kF32) {
    args.out = static_cast<float*>(out.data());
    cuda_->codec->decode(args);
    return;
  }
  const bool bf16 = out.dtype() == DType::kBF16;
  scratch.values.reserve(std::max<std::size_t>(n, 1) * sizeof(float));
  auto* values = scratch.values.as<float>();
  if (args.accumulate) {
    kernels::launch_half_to_float(static_cast<const std::uint16_t*>(out.data()), values, n, bf16, stream);
  }
  args.out = values;
  cuda_->codec->decode(args);
  kernels::launch_float_to_half(values, static_cast<std::uint16_t*>(out.data()), n, bf16, stream);
}

}  // namespace gradcomp
#endif
