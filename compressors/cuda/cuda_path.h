// Device-side state of one ErrorFeedbackCompressor: the CUDA backend of its codec, the per-tensor state buffers that
// live on the device while the CUDA path is used, and the per-device workspace (grown once, reused by every call).
//
// Where a tensor's state lives: a tensor compressed on the GPU keeps its buffers on the device (`device_newer`); the
// host copy is refreshed lazily when the host needs it (save_state, state_of, a CPU compress of the same name). A
// CPU compress of that name then drops the device copy, which is re-uploaded by the next CUDA compress.
#pragma once

#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compressors/cuda/cuda_codec.h"
#include "kernels/cuda_buffer.h"

namespace gradcomp {

struct DeviceTensorState {
  int device = 0;
  std::size_t numel = 0;
  // current[b] / next[b]: buffer b (0 = residual, empty when ef=off) and where encode() writes its new value.
  std::vector<kernels::DeviceBuffer> current, next;
  bool device_newer = false;
  // The end of the last compress that wrote the buffers (its nonfinite=pass reset runs after the call returns):
  // a compress on another stream waits for it on the device, a copy to the host waits for it on the host.
  kernels::StreamMark written;
};

// Per-device scratch, shared by every tensor and stream of one compressor. A call on stream B may start while one
// on stream A still reads it (decompress returns with its kernels queued), so each call first orders its stream
// after `released` (the end of the previous call's use) and records it again when it is done.
struct DeviceScratch {
  kernels::DeviceBuffer workspace;    // codec workspace (two-phase: sized by CudaCodec::workspace_bytes)
  kernels::DeviceBuffer counters;     // kernels::DeviceCounters
  kernels::DeviceBuffer values;       // f32 copy of an f16/bf16 gradient or output
  kernels::DeviceBuffer staging;      // a host payload (or a misaligned device one) staged for a device decode
  kernels::DeviceBuffer checks;       // a decode's per-part error flags and check words
  kernels::PinnedBuffer meta;         // a device payload's metadata block (kernels/payload_meta.cuh), written there
  kernels::PinnedBuffer checks_host;  // the checks, read back
  kernels::StreamMark released;
};

// Marks the end of one call's use of the per-device scratch when the call leaves, by return or by exception, so the
// next call on another stream waits for the kernels this one queued (and orders this call after the previous one).
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

class CudaPath {
 public:
  std::unique_ptr<CudaCodec> codec;  // null when the codec has no CUDA backend
  std::map<std::string, DeviceTensorState, std::less<>> states;
  std::map<int, DeviceScratch> scratch;  // by device ordinal
  // By device ordinal: the zero state a skipped segment (nonfinite=skip) is encoded against; its buffers grow to
  // the largest such segment and are reused.
  std::map<int, DeviceTensorState> work;
};

}  // namespace gradcomp
#else
namespace gradcomp {
class CudaPath {};
}  // namespace gradcomp
#endif
