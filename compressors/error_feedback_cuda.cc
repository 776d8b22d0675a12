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
#include "compressors/segmented_payload.h"
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

constexpr std::size_t kCounterBytes = 256;  // DeviceCounters

}  // namespace

bool is_device_memory(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

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

namespace {

// Host bytes to device memory in stream order, in kernel-argument blocks (no host buffer has to outlive the call).
void write_bytes_device(std::byte* out, const std::byte* bytes, std::size_t count, cudaStream_t stream) {
  for (std::size_t done = 0; done < count; done += kernels::kMaxWriteBytes) {
    kernels::launch_write_bytes(out + done, bytes + done, std::min(kernels::kMaxWriteBytes, count - done), stream);
  }
}

}  // namespace

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
  const std::vector<TensorSegment> segments = resolve_segments(ctx, n, name_);
  const std::size_t count = segments.size();
  const std::size_t needed = payload_bound(n, segments);
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
  for (const TensorSegment& segment : segments) check_state_size(segment.name, segment.total, ctx.rank);
  std::vector<DeviceTensorState*> dstates;
  std::vector<TensorState*> hstates;
  std::size_t largest = 0;
  for (const TensorSegment& segment : segments) {
    dstates.push_back(&device_state_for(segment.name, segment.total, device, stream, ctx.rank));
    hstates.push_back(&states_.find(segment.name)->second);
    largest = std::max(largest, segment.numel);
  }
  const std::size_t buffer_count = 1 + extra_state_buffers();

  DeviceScratch& scratch = cuda_->scratch[device];
  const ScratchUse scratch_use(scratch, stream);
  scratch.counters.reserve(kCounterBytes);
  scratch.workspace.reserve(std::max<std::size_t>(codec.workspace_bytes(largest), 256));
  const float* values = static_cast<const float*>(grad.data());
  if (grad.dtype() != DType::kF32) {
    scratch.values.reserve(std::max<std::size_t>(n, 1) * sizeof(float));
    kernels::launch_half_to_float(static_cast<const std::uint16_t*>(grad.data()), scratch.values.as<float>(), n,
                                  grad.dtype() == DType::kBF16, stream);
    values = scratch.values.as<float>();
  }
  auto* counters = scratch.counters.as<kernels::DeviceCounters>();

  // Segment s as if alone into `slot`: against its own state (its range of it, for a chunk), or, when `zero`, a
  // zero gradient against zero state (nonfinite=skip). The codec writes new state values into the next buffers.
  std::vector<char> zero(count, 0), dirty(count, 0), encoded(count, 0);
  std::vector<std::vector<double>> scalars_before(count);
  kernels::DeviceBuffer zero_input;
  auto encode_one = [&](std::size_t s, std::byte* slot, CompressStats& stats) {
    const TensorSegment& segment = segments[s];
    const std::size_t m = segment.numel;
    std::vector<const float*> current(buffer_count, nullptr);
    std::vector<float*> next(buffer_count, nullptr);
    TensorState throwaway;
    TensorState* host = hstates[s];
    const float* input = values + segment.offset;
    if (zero[s]) {
      DeviceTensorState& work = cuda_->work[device];
      work.written.order_before(stream);
      work.current.resize(buffer_count);
      work.next.resize(buffer_count);
      for (std::size_t b = 0; b < buffer_count; ++b) {
        if (b == 0 && !ef_) continue;
        work.current[b].reserve(std::max<std::size_t>(m, 1) * sizeof(float));
        work.next[b].reserve(std::max<std::size_t>(m, 1) * sizeof(float));
        GRADCOMP_CUDA_CHECK(cudaMemsetAsync(work.current[b].data(), 0, m * sizeof(float), stream));
        current[b] = work.current[b].as<const float>();
        next[b] = work.next[b].as<float>();
      }
      zero_input.reserve(std::max<std::size_t>(m, 1) * sizeof(float));
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(zero_input.data(), 0, m * sizeof(float), stream));
      input = zero_input.as<const float>();
      throwaway.numel = m;
      throwaway.scalars = host->scalars;
      host = &throwaway;
    } else {
      for (std::size_t b = 0; b < buffer_count; ++b) {
        if (!dstates[s]->current[b].data()) continue;
        current[b] = dstates[s]->current[b].as<const float>() + segment.start;
        next[b] = dstates[s]->next[b].as<float>() + segment.start;
      }
    }
    CompressContext alone = ctx;
    alone.name = segment.name;
    alone.segments = {};
    alone.step = segment_step(segment, ctx.step);
    CudaEncodeArgs args;
    args.grad = input;
    args.numel = m;
    args.ctx = &alone;
    args.state = host;
    args.tensor_key = segment_stream_key(segment);
    args.original_dtype = grad.dtype();
    args.buffers = current;
    args.next = next;
    args.counters = counters;
    args.workspace = scratch.workspace.data();
    args.stream = stream;
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(counters, 0, sizeof(kernels::DeviceCounters), stream));
    const std::size_t size = codec.encode(args, slot, stats);
    kernels::DeviceCounters host_counters{};
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&host_counters, counters, sizeof(host_counters), cudaMemcpyDeviceToHost, stream));
    kernels::synchronize_stream(stream);
    stats.nonfinite = host_counters.nonfinite;
    stats.saturated = std::max<std::size_t>(stats.saturated, host_counters.saturated);
    return size;
  };
  stats_ = CompressStats{};
  stats_.numel = n;
  // The non-finite policy per segment, after its fused pass counted (the state is committed only at the end).
  auto encode_at = [&](std::size_t s, std::byte* slot) {
    CompressStats part;
    scalars_before[s] = hstates[s]->scalars;
    std::size_t size = encode_one(s, slot, part);
    if (part.nonfinite > 0) {
      stats_.nonfinite += part.nonfinite;
      if (nonfinite_ == NonFinitePolicy::kPass) {
        dirty[s] = 1;
      } else {
        hstates[s]->scalars = scalars_before[s];
        if (nonfinite_ == NonFinitePolicy::kRaise) {
          for (std::size_t t = 0; t < count; ++t) {
            if (encoded[t]) hstates[t]->scalars = scalars_before[t];
          }
          const TensorSegment& segment = segments[s];
          std::vector<float> host(segment.numel);
          GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), values + segment.offset, segment.numel * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream));
          kernels::synchronize_stream(stream);
          const auto bad = std::find_if(host.begin(), host.end(), [](float v) { return !std::isfinite(v); });
          const auto index = static_cast<std::size_t>(bad - host.begin());
          throw_nonfinite(ctx, segment, part.nonfinite, index, bad == host.end() ? 0.0f : *bad);
        }
        zero[s] = 1;
        part = CompressStats{};
        size = encode_one(s, slot, part);
        part.nonfinite = 0;
      }
    }
    encoded[s] = 1;
    stats_.selected += part.selected;
    stats_.saturated += part.saturated;
    return size;
  };
  std::size_t size = 0;
  if (count == 1) {
    size = encode_at(0, out.data());
  } else if (traits_.summable) {
    // One dense body, segment s's values at their place; last to first, as on the host (each segment's header
    // lands on bytes written after it).
    const std::size_t wire = dtype_size(traits_.wire_dtype);
    for (std::size_t s = count; s-- > 0;) {
      const std::size_t written = encode_at(s, out.data() + segments[s].offset * wire);
      GRADCOMP_ASSERT(written == payload::kHeaderBytes + segments[s].numel * wire,
                      "summable codec '{}' wrote {} bytes for {} values", name_, written, segments[s].numel);
    }
    payload::Header header;
    header.codec = codec_;
    header.numel = n;
    header.dtype = grad.dtype();
    header.section_count = 1;
    header.section_bytes[0] = n * wire;
    write_header_device(header, out.data(), stream);
    size = payload::total_bytes(header);
  } else {
    payload::SegmentedWriter writer(codec_, n, grad.dtype(), count, out.size());
    for (std::size_t s = 0; s < count; ++s) {
      writer.commit(segments[s].numel, encode_at(s, out.data() + writer.next_offset()));
      if (writer.padding_before()) {
        GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data() + writer.next_offset() - writer.padding_before(), 0,
                                            writer.padding_before(), stream));
      }
    }
    const std::vector<std::byte> prefix = writer.prefix();
    write_bytes_device(out.data(), prefix.data(), prefix.size(), stream);
    size = writer.total_bytes();
  }

  // Commit: the new state of every segment that took its step (a chunk's range copied, a whole tensor swapped).
  for (std::size_t s = 0; s < count; ++s) {
    if (zero[s]) {
      stats_.skipped = true;
      continue;
    }
    const TensorSegment& segment = segments[s];
    DeviceTensorState& dstate = *dstates[s];
    for (std::size_t b = 0; b < buffer_count; ++b) {
      if (!dstate.next[b].data()) continue;
      if (is_whole(segment)) {
        dstate.current[b].swap(dstate.next[b]);
      } else if (segment.numel) {
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dstate.current[b].as<float>() + segment.start,
                                            dstate.next[b].as<const float>() + segment.start,
                                            segment.numel * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      }
      if (dirty[s]) kernels::launch_zero_nonfinite(dstate.current[b].as<float>() + segment.start, segment.numel, stream);
    }
    dstate.device_newer = true;
    dstate.written.record(stream);
    if (segment.start == 0) ++hstates[s]->steps;
  }
  if (stats_.skipped) cuda_->work[device].written.record(stream);
  stats_.payload_bytes = size;
  return size;
}

}  // namespace gradcomp
#endif
