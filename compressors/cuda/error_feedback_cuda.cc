// The CUDA path of ErrorFeedbackCompressor: device-resident state per tensor name, a per-device workspace grown once,
// f16/bf16 conversion, host <-> device coherence of the state, and the device SegmentStore through which the one
// compress flow (compressors/framework/ef_flow.h) runs. The codec-specific part is a CudaCodec (compressors/cuda/cuda_codec.h).
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compressors/cuda/cuda_path.h"
#include "compressors/framework/ef_flow.h"
#include "compressors/framework/error_feedback.h"
#include "compressors/framework/segments.h"
#include "gradcomp/error.h"
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"

namespace gradcomp {
namespace {

constexpr std::size_t kCounterBytes = 256;  // DeviceCounters

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

// The CUDA memory space of compress_segments(): device gradient values, DeviceTensorState buffers (encode writes
// `next`, commit makes it current), a device output, all on one stream.
class ErrorFeedbackCompressor::DeviceStore final : public SegmentStore {
 public:
  DeviceStore(ErrorFeedbackCompressor& owner, const FlowCall& call, const float* values,
              std::vector<DeviceTensorState*> dstates, int device, cudaStream_t stream, DeviceScratch& scratch)
      : owner_(owner), call_(call), values_(values), dstates_(std::move(dstates)), device_(device), stream_(stream),
        scratch_(scratch), buffer_count_(1 + owner.extra_state_buffers()) {}

  bool counts_in_encode() const override { return true; }  // DeviceCounters::nonfinite
  std::size_t scan(std::size_t, std::size_t& first) override { return first = 0; }  // never called
  std::pair<std::size_t, float> first_nonfinite(std::size_t s, std::size_t) override {
    const TensorSegment& segment = call_.segments[s];
    std::vector<float> host(segment.numel);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), values_ + segment.offset, segment.numel * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream_));
    kernels::synchronize_stream(stream_);
    const auto bad = std::find_if(host.begin(), host.end(), [](float v) { return !std::isfinite(v); });
    return {static_cast<std::size_t>(bad - host.begin()), bad == host.end() ? 0.0f : *bad};
  }
  // Segment s against its own state (its range of it, for a chunk), or, when `zero`, a zero gradient against the
  // per-device zero state. The codec writes new state values into the next buffers.
  std::size_t encode(std::size_t s, bool zero, std::span<std::byte> slot, CompressStats& stats,
                     std::size_t&) override {
    const TensorSegment& segment = call_.segments[s];
    std::vector<const float*> current(buffer_count_, nullptr);
    std::vector<float*> next(buffer_count_, nullptr);
    TensorState throwaway;
    TensorState* host = call_.states[s];
    const float* input = values_ + segment.offset;
    if (zero) {
      input = zero_state(segment.numel, current, next);
      throwaway.numel = segment.numel;
      throwaway.scalars = host->scalars;
      host = &throwaway;
    } else {
      for (std::size_t b = 0; b < buffer_count_; ++b) {
        if (!dstates_[s]->current[b].data()) continue;
        current[b] = dstates_[s]->current[b].as<const float>() + segment.start;
        next[b] = dstates_[s]->next[b].as<float>() + segment.start;
      }
    }
    CompressContext alone = *call_.ctx;
    alone.name = segment.name;
    alone.segments = {};
    alone.step = segment_step(segment, call_.ctx->step);
    CudaEncodeArgs args;
    args.grad = input;
    args.numel = segment.numel;
    args.ctx = &alone;
    args.state = host;
    args.tensor_key = segment_stream_key(segment);
    args.original_dtype = call_.dtype;
    args.buffers = current;
    args.next = next;
    args.counters = scratch_.counters.as<kernels::DeviceCounters>();
    args.workspace = scratch_.workspace.data();
    args.stream = stream_;
    return encode_counted(args, slot.data(), stats);
  }
  void write(std::byte* dst, std::span<const std::byte> bytes) override {
    // Host bytes in stream order, in kernel-argument blocks (no host buffer has to outlive the call).
    for (std::size_t done = 0; done < bytes.size(); done += kernels::kMaxWriteBytes) {
      kernels::launch_write_bytes(dst + done, bytes.data() + done,
                                  std::min(kernels::kMaxWriteBytes, bytes.size() - done), stream_);
    }
  }
  void fill_zero(std::byte* dst, std::size_t n) override {
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream_));
  }
  // A chunk's range copied, a whole tensor's buffers swapped.
  void commit(std::size_t s, bool dirty) override {
    const TensorSegment& segment = call_.segments[s];
    DeviceTensorState& dstate = *dstates_[s];
    for (std::size_t b = 0; b < buffer_count_; ++b) {
      if (!dstate.next[b].data()) continue;
      if (is_whole(segment)) {
        dstate.current[b].swap(dstate.next[b]);
      } else if (segment.numel) {
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dstate.current[b].as<float>() + segment.start,
                                            dstate.next[b].as<const float>() + segment.start,
                                            segment.numel * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
      }
      if (dirty) kernels::launch_zero_nonfinite(dstate.current[b].as<float>() + segment.start, segment.numel, stream_);
    }
    dstate.device_newer = true;
    dstate.written.record(stream_);
  }
  void finish(bool any_skipped) override {
    if (any_skipped) owner_.cuda_->work[device_].written.record(stream_);
  }

 private:
  // The zero state of `m` elements (buffers zeroed into `current`, `next` beside them) and a zero gradient.
  const float* zero_state(std::size_t m, std::vector<const float*>& current, std::vector<float*>& next) {
    const std::size_t bytes = std::max<std::size_t>(m, 1) * sizeof(float);
    DeviceTensorState& work = owner_.cuda_->work[device_];
    work.written.order_before(stream_);
    work.current.resize(buffer_count_);
    work.next.resize(buffer_count_);
    for (std::size_t b = 0; b < buffer_count_; ++b) {
      if (b == 0 && !owner_.ef_) continue;
      work.current[b].reserve(bytes);
      work.next[b].reserve(bytes);
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(work.current[b].data(), 0, m * sizeof(float), stream_));
      current[b] = work.current[b].as<const float>();
      next[b] = work.next[b].as<float>();
    }
    zero_input_.reserve(bytes);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(zero_input_.data(), 0, m * sizeof(float), stream_));
    return zero_input_.as<const float>();
  }
  // The codec's encode with zeroed counters, then one wait for them: the non-finite count and saturation.
  std::size_t encode_counted(const CudaEncodeArgs& args, std::byte* slot, CompressStats& stats) {
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(args.counters, 0, sizeof(kernels::DeviceCounters), stream_));
    const std::size_t size = owner_.cuda_->codec->encode(args, slot, stats);
    kernels::DeviceCounters host_counters{};
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&host_counters, args.counters, sizeof(host_counters), cudaMemcpyDeviceToHost, stream_));
    kernels::synchronize_stream(stream_);
    stats.nonfinite = host_counters.nonfinite;
    stats.saturated = std::max<std::size_t>(stats.saturated, host_counters.saturated);
    return size;
  }

  ErrorFeedbackCompressor& owner_;
  const FlowCall& call_;
  const float* values_;
  std::vector<DeviceTensorState*> dstates_;
  int device_;
  cudaStream_t stream_;
  DeviceScratch& scratch_;
  std::size_t buffer_count_;
  kernels::DeviceBuffer zero_input_;
};

CudaCodec* ErrorFeedbackCompressor::cuda_codec() {
  if (!cuda_) {
    cuda_ = std::make_unique<CudaPath>();
    cuda_->codec = make_cuda_codec(codec_, params_);
  }
  return cuda_->codec.get();
}

void ErrorFeedbackCompressor::require_cuda_codec(const TensorView& grad, const CompressContext& ctx) {
  GRADCOMP_CHECK(cuda_codec() != nullptr, "compressor '{}' has no CUDA path (tensor '{}' is {})", name_, ctx.name,
                 grad.describe());
}

std::size_t ErrorFeedbackCompressor::compress_cuda(const TensorView& grad, std::span<std::byte> out,
                                                   const CompressContext& ctx,
                                                   std::span<const TensorSegment> segments) {
  const std::size_t n = grad.numel();
  const int device = grad.device().index;
  kernels::DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(grad.stream());
  std::vector<DeviceTensorState*> dstates;
  std::vector<TensorState*> hstates;
  std::size_t largest = 0;
  for (const TensorSegment& segment : segments) {
    dstates.push_back(&device_state_for(segment.name, segment.total, device, stream, ctx.rank));
    hstates.push_back(&states_.find(segment.name)->second);
    largest = std::max(largest, segment.numel);
  }
  DeviceScratch& scratch = cuda_->scratch[device];
  const ScratchUse scratch_use(scratch, stream);
  scratch.counters.reserve(kCounterBytes);
  scratch.workspace.reserve(std::max<std::size_t>(cuda_->codec->workspace_bytes(largest), 256));
  const float* values = static_cast<const float*>(grad.data());
  if (grad.dtype() != DType::kF32) {
    scratch.values.reserve(std::max<std::size_t>(n, 1) * sizeof(float));
    kernels::launch_half_to_float(static_cast<const std::uint16_t*>(grad.data()), scratch.values.as<float>(), n,
                                  grad.dtype() == DType::kBF16, stream);
    values = scratch.values.as<float>();
  }
  const FlowCall call{name_, codec_, traits_, nonfinite_, &ctx, segments, hstates, n, grad.dtype()};
  DeviceStore store(*this, call, values, std::move(dstates), device, stream, scratch);
  return compress_segments(call, store, out, stats_);
}

}  // namespace gradcomp
#endif
