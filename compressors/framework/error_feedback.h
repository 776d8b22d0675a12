// ErrorFeedbackCompressor: the shared machinery of every built-in codec. It owns the per-tensor state (residual and
// any codec-specific buffers, keyed by tensor name), applies the non-finite policy, converts f16/bf16 tensors,
// saves/loads state, and leaves only encode()/decode() of f32 values to each codec.
//
// Error feedback (Stich 2018; Karimireddy et al. 2019): with a residual r per tensor, a step compresses v = g + r and
// keeps r' = v - transmitted. Codecs fuse this into encode(): they read grad and residual, write the payload and the
// new residual in one pass. With ef=off the residual pointer is null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compressors/framework/gather_codec.h"
#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"

namespace gradcomp {

// What to do when a gradient holds NaN or Inf.
enum class NonFinitePolicy {
  kRaise,  // throw InvalidArgument naming the tensor, rank, index and value; state untouched (default)
  kSkip,   // transmit zeros for this tensor this step; state untouched
  kPass,   // compress as given; residual entries that become non-finite are reset to zero
};

// "raise", "skip" or "pass" (as validated by the nonfinite parameter) to its policy.
NonFinitePolicy parse_nonfinite_policy(const std::string& text);

// Parameters every lossy codec accepts: ef=on|off, nonfinite=raise|skip|pass.
std::vector<ParamSpec> lossy_common_params();
// Only nonfinite=... (for lossless codecs).
std::vector<ParamSpec> lossless_common_params();

// Per-tensor state.
struct TensorState {
  std::uint64_t numel = 0;
  std::uint64_t steps = 0;                   // compress() calls so far for this name
  std::vector<std::vector<float>> buffers;   // buffers[0] = residual (when ef=on); codecs may add more
  std::vector<double> scalars;               // codec-specific scalars (e.g. an adaptive threshold)
  // The fused path's second residual (fuses_nonfinite_scan(); never saved): encode() writes the new residual here
  // and a compress that keeps it swaps it with buffers[0]. Empty until a fusing codec first compresses this tensor.
  std::vector<float> residual_next;
};

// Inputs of one encode() call. `grad` is f32 and already multiplied by nothing: codecs apply ctx.prescale
// themselves where they support it.
struct EncodeArgs {
  const float* grad = nullptr;
  // Null when ef=off. In-place path: in: residual, out: residual + grad - transmitted. Fused path (residual_out
  // non-null): input only, the codec must not write it.
  float* residual = nullptr;
  // Fused path only (fuses_nonfinite_scan(), ef=on): where the codec writes the complete new residual
  // residual + grad - transmitted (all numel values); null otherwise, and then the update is in place.
  float* residual_out = nullptr;
  // Fused path only: the codec stores the smallest index of a non-finite `grad` value here (numel when none), and
  // their count in CompressStats::nonfinite.
  std::size_t* first_nonfinite = nullptr;
  std::size_t numel = 0;
  const CompressContext* ctx = nullptr;
  TensorState* state = nullptr;  // never null; buffers sized by extra_state_buffers()
  std::uint64_t tensor_key = 0;  // fnv1a64(ctx->name)
  DType original_dtype = DType::kF32;
  int threads = 0;
};

class CudaCodec;           // compressors/cuda/cuda_codec.h
class CudaPath;            // compressors/cuda/cuda_path.h
struct DeviceTensorState;  // compressors/cuda/cuda_path.h

// A call made of several tensors (CompressContext::segments) is compressed segment by segment, each exactly as it
// would be alone: a summable (elementwise) codec writes each segment's values at its place in one dense body, any
// other codec writes each segment as a complete payload inside a segmented container (compressors/
// segmented_payload.h). Each segment works on its own tensor's state in place (no gather, no scatter), its random
// streams are keyed by the tensor (segment_stream_key), and the non-finite policy applies to it alone; a call that
// raises or is refused changes no state. A summable codec also encodes from, and decodes into, the segments' own
// memory (GatherCodec; compressors/framework/error_feedback_parts.cc).
class ErrorFeedbackCompressor : public Compressor, public GatherCodec {
 public:
  ErrorFeedbackCompressor(std::string name, payload::CodecId codec, CompressorTraits traits,
                          std::vector<ParamSpec> param_specs, Params params);
  ~ErrorFeedbackCompressor() override;

  std::string_view name() const override { return name_; }
  std::string spec() const override;
  CompressorTraits traits() const override { return traits_; }
  std::size_t payload_bound(std::size_t numel, std::span<const TensorSegment> segments) const override;
  std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx) override;
  void decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) override;
  void decompress_sum(std::span<const PayloadBytes> payloads, const TensorView& out, DecodeMode first) override;
  std::vector<std::byte> save_state() const override;
  void load_state(std::span<const std::byte> state) override;
  void reset_state() override;
  void set_threads(int threads) override { threads_ = threads; }
  CompressStats last_stats() const override { return stats_; }
  bool gathers() const override { return traits_.summable; }
  std::size_t compress_parts(std::span<const TensorView> parts, std::span<std::byte> out,
                             const CompressContext& ctx) override;
  void decompress_parts(std::span<const std::byte> payload, std::span<const TensorView> parts,
                        DecodeMode mode) override;

  bool error_feedback() const { return ef_; }
  NonFinitePolicy nonfinite_policy() const { return nonfinite_; }
  // State of `name`, or null if it has none yet (for tests and diagnostics).
  const TensorState* state_of(std::string_view name) const;
  // Every tensor name with state, and its element count.
  std::map<std::string, std::size_t> state_sizes() const;

 protected:
  // Writes the payload of `args` into `out` (at least max_payload_bytes(numel) bytes); returns its size and fills
  // `stats.selected` / `stats.saturated`.
  virtual std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) = 0;
  // Decodes a payload that parse() already validated against codec() and numel. `out` holds `numel` f32 values;
  // with accumulate it adds. Must validate section sizes and indices (throw CorruptPayload) before writing.
  virtual void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) = 0;
  // Throws CorruptPayload unless decode(view, ..., numel, ...) would succeed; writes nothing. A segmented payload is
  // validated part by part before any part is decoded, so a corrupt part leaves the whole output untouched. The
  // default accepts everything (decode() still validates its own part).
  virtual void validate(const payload::View& view, std::size_t numel) const;
  // Codec-specific state buffers (each numel floats) beyond the residual, e.g. DGC's momentum.
  virtual std::size_t extra_state_buffers() const { return 0; }
  // Opt-in fused non-finite scan. A codec returning true promises that its encode(), given EncodeArgs::residual_out
  // and EncodeArgs::first_nonfinite, (1) reads the residual from `residual` without writing it and writes the
  // whole new residual to `residual_out`, (2) counts the non-finite values of `grad` into CompressStats::nonfinite
  // and stores the first one's index in *first_nonfinite, (3) keeps no extra state buffers (scalars it changes are
  // restored by the base when the step is not kept). The base then skips its separate scan pass over the gradient
  // and applies the non-finite policy after encode(): raise and skip discard residual_out (the state is untouched),
  // otherwise the two residual buffers swap. Under raise the output buffer's contents are then unspecified. Such a
  // codec must still work in place when residual_out is null (chunks of a tensor and skipped segments use that).
  virtual bool fuses_nonfinite_scan() const { return false; }
  // Decodes payloads of one tensor (plain or segmented; each in host memory or out's device's) into a CUDA tensor,
  // the first with `first`, the others accumulating: every part of every payload is checked before any is written,
  // with one host wait for the device payloads' metadata and one for the device checks of all parts
  // (compressors/cuda/error_feedback_cuda_decode.cc). Returns with the decode queued on out.stream().
  virtual void decompress_cuda(std::span<const PayloadBytes> payloads, const TensorView& out, DecodeMode first);

  payload::CodecId codec() const { return codec_; }
  const Params& params() const { return params_; }
  int threads() const { return threads_; }
  // Finds or creates the state of `name` for a tensor of `numel` elements; throws InvalidArgument if the existing
  // state has another size.
  TensorState& state_for(std::string_view name, std::size_t numel, int rank);

 private:
  // The SegmentStores of compress_segments() (compressors/framework/ef_flow.h): host memory (error_feedback.cc) and a CUDA
  // device (error_feedback_cuda.cc).
  class HostStore;
  class DeviceStore;
  // The CUDA path of compress(), taken for tensors on a CUDA device once compress() checked the call (`segments`
  // from resolve_segments, the output size, the state sizes): the codec's CudaCodec backend (compressors/
  // cuda_codec.h, listed in compressors/cuda/cuda_codecs.cc) with the state kept on the device. `out` is device memory.
  // Runs on grad.stream(); synchronizes that stream once per segment (to learn the non-finite count and, for
  // data-dependent sizes, the payload size).
  std::size_t compress_cuda(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx,
                            std::span<const TensorSegment> segments);
  // The host path of compress() once its checks passed: segment s's f32 values at values[s], host output.
  std::size_t compress_host(std::span<const float* const> values, std::span<const TensorSegment> segments,
                            std::size_t numel, DType dtype, std::span<std::byte> out, const CompressContext& ctx);
  // Creates the CUDA backend on first use; throws InvalidArgument for a codec without one or in builds without CUDA.
  void require_cuda_codec(const TensorView& grad, const CompressContext& ctx);
  // CUDA builds: the codec's CUDA backend, created on first use; null when it has none.
  CudaCodec* cuda_codec();
  // Encodes segment `segment` (its values at `values`) into `slot` as a complete payload with the state `state`
  // (a zero gradient against zero state when `zero`). `fused`: the codec's fused scan writes the new residual into
  // state.residual_next; otherwise the update is in place (on the segment's range of the state). Returns the size.
  std::size_t encode_segment(const float* values, const TensorSegment& segment, TensorState& state,
                             const CompressContext& ctx, DType dtype, bool zero, bool fused, std::span<std::byte> slot,
                             CompressStats& stats, std::size_t& first_bad);
  // Host <-> device state coherence (no-ops without CUDA). sync_to_host: copy a device-newer state of `name` (or of
  // every name when empty) into the host TensorState; drop_device also frees the device copy.
  void sync_to_host(std::string_view name, bool drop_device) const;
  void drop_device_states();
  // CUDA builds: the host and device state of `name` (numel elements) on `device`, created (uploaded from the host
  // state when it has one) if missing, and ordered after its last writer on `stream` (a cudaStream_t).
  DeviceTensorState& device_state_for(std::string_view name, std::size_t numel, int device, void* stream, int rank);
  // Throws InvalidArgument when `name` already has state of another size than `numel`.
  void check_state_size(std::string_view name, std::size_t numel, int rank) const;
  // Copies `n` bytes at the start of `payload` (host memory: a host output's payload) to `dst`.
  void read_prefix(std::span<const std::byte> payload, std::byte* dst, std::size_t n, const TensorView& out) const;
  // Throws InvalidArgument unless `memory` is host memory (a CPU `out` decodes host payloads only).
  void require_host_payload(Memory memory, const TensorView& out) const;
  // Decodes one plain payload into a host tensor.
  void decompress_plain(std::span<const std::byte> payload, const TensorView& out, DecodeMode mode);
  // Decodes a validated plain payload into a host tensor of view.header.numel elements (f16/bf16 through f32).
  void decode_view(const payload::View& view, const TensorView& out, DecodeMode mode);

  std::string name_;
  payload::CodecId codec_;
  CompressorTraits traits_;
  std::vector<ParamSpec> param_specs_;
  Params params_;
  bool ef_ = false;
  NonFinitePolicy nonfinite_ = NonFinitePolicy::kRaise;
  int threads_ = 0;
  CompressStats stats_;
  // mutable: const readers (save_state, state_of) first pull device-newer state back to the host.
  mutable std::map<std::string, TensorState, std::less<>> states_;
  mutable std::unique_ptr<CudaPath> cuda_;
  std::vector<float> scratch_in_, scratch_out_, zeros_;
  std::vector<std::byte> scratch_payload_;  // a payload at an unaligned address, copied to aligned memory to decode
  TensorState slice_;  // a chunk's state when the codec keeps extra buffers (copied in and out around encode)
};

}  // namespace gradcomp
