// The CUDA half of a codec (CUDA builds only). ErrorFeedbackCompressor owns the device state and the workspace and
// calls these; a codec's CUDA backend only turns device values into a payload in exactly the CPU format, and back.
//
// Backends live in compressors/<codec>_cuda_backend.cc (host orchestration) + kernels/<codec>_cuda.cu (kernels) and are
// listed in compressors/cuda/cuda_codecs.cc, so a codec's CPU file never needs to change for its CUDA path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include <cuda_runtime_api.h>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/payload.h"
#include "kernels/cuda_counters.cuh"

namespace gradcomp {

// Inputs of one CUDA encode. Every pointer is device memory on the current device unless said otherwise.
struct CudaEncodeArgs {
  const float* grad = nullptr;  // numel f32 values (converted from f16/bf16 by the caller)
  std::size_t numel = 0;
  const CompressContext* ctx = nullptr;  // host
  TensorState* state = nullptr;          // host: steps and scalars; its float buffers are NOT used on this path
  std::uint64_t tensor_key = 0;          // fnv1a64(ctx->name)
  DType original_dtype = DType::kF32;
  // State buffers, numel floats each: buffers[0] is the residual (null when ef=off), then the codec's extra buffers.
  // encode() reads buffers[b] and writes the complete new value of every non-null buffer into next[b]; the caller
  // swaps them only after the whole call succeeded, so a failed or rejected step leaves the state untouched.
  std::span<const float* const> buffers;
  std::span<float* const> next;
  kernels::DeviceCounters* counters = nullptr;  // zeroed before encode(); encode() must count grad's non-finite values
  void* workspace = nullptr;                     // workspace_bytes(numel) bytes
  cudaStream_t stream = nullptr;
};

// Inputs of one CUDA decode of one plain payload (or one part of a segmented one). The header was validated on the
// host; the sections point to device memory, the first at a 16-byte aligned address.
struct CudaDecodeArgs {
  const payload::View* view = nullptr;
  float* out = nullptr;  // numel f32 values, device
  std::size_t numel = 0;
  bool accumulate = false;
  int* error_flag = nullptr;              // device int, zeroed before validate(); device checks set it non-zero
  std::uint64_t* check_word = nullptr;    // device u64, zeroed before validate(); read back with the flag
  std::span<const std::byte> lead;        // host copy of the first (up to 32) bytes of section 0
  void* workspace = nullptr;  // decode_workspace_bytes(numel) bytes
  cudaStream_t stream = nullptr;
};

class CudaCodec {
 public:
  virtual ~CudaCodec() = default;
  // Device scratch bytes encode()/decode() need for `numel` elements (the query half of the two-phase protocol).
  virtual std::size_t workspace_bytes(std::size_t numel) const = 0;
  virtual std::size_t decode_workspace_bytes(std::size_t numel) const { return workspace_bytes(numel); }
  // Writes the payload (header included) to `out` (device, at least max_payload_bytes(numel)); returns its size and
  // fills stats.selected / stats.saturated (the caller reads the counters for nonfinite). May synchronize the
  // stream when a size is data-dependent.
  virtual std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) = 0;
  // Decoding runs in three rounds over every part of a payload, so that a corrupt part leaves the whole output
  // untouched and the host waits once for the device checks of all parts: validate() every part, checked() every
  // part once the flags and words are back on the host, decode() every part.
  //
  // validate(): the host checks of the sections against the header (throw CorruptPayload), then enqueues the device
  // checks that must pass before anything is written (indices in range and increasing, finite scales), which set
  // *args.error_flag, and may copy one payload word to *args.check_word. Returns true when it enqueued anything.
  virtual bool validate(const CudaDecodeArgs& args) = 0;
  // With the part's flag and word read back (only called when validate() returned true): throws CorruptPayload when
  // they show a corrupt part.
  virtual void checked(const CudaDecodeArgs& args, int flag, std::uint64_t word) const {
    (void)args, (void)flag, (void)word;
  }
  // Writes the part into args.out (overwrite or add). validate() and checked() passed: no checks, no host wait.
  virtual void decode(const CudaDecodeArgs& args) = 0;
};

// The CUDA backend of `codec` configured by `params` (as the CPU codec parsed them), or null when it has none.
std::unique_ptr<CudaCodec> make_cuda_codec(payload::CodecId codec, const Params& params);

// Writes `header` (64 bytes) to device memory `out` and zeroes the padding between its sections, enqueued on
// `stream`. The bytes travel as a kernel argument: no host buffer has to outlive the call (a cudaMemcpyAsync from
// pageable stack memory would be staged synchronously, or read after the frame is gone if it ever were pinned).
void write_header_device(const payload::Header& header, std::byte* out, cudaStream_t stream);

}  // namespace gradcomp
