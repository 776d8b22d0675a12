// The Compressor interface: turns a gradient into a self-describing payload and back, keeping per-tensor state
// (error-feedback residuals, momenta, step counters) keyed by a stable tensor name.
#pragma once

#include <cstddef>
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradcomp/tensor.h"

namespace gradcomp {

// How the communication layer may combine payloads of a codec. The collective is chosen from these, never by the
// caller (see comm/algorithms).
struct CompressorTraits {
  // The payload body is one dense array of `wire_dtype` that may be summed elementwise (none, fp16, bf16).
  bool summable = false;
  // The payload is a sparse selection; aggregation = decompress-and-add of every rank's payload (top-k, DGC, ...).
  bool gatherable = false;
  // Chunks may be decompressed, summed and compressed again (scatter-reduce-allgather: QSGD, TernGrad, 1-bit).
  bool requantizable = false;
  // Aggregated in summable rounds with local computation between them (PowerSGD: the P round, then the Q round).
  // compressed_allreduce's rounds algorithm drives Compressor::begin_rounds(); allgather works too.
  bool rounds = false;
  // Compression loses information (error feedback applies).
  bool lossy = false;
  // Element type of a summable body.
  DType wire_dtype = DType::kF32;
};

// "summable,lossy" style list, for humans.
std::string describe_traits(const CompressorTraits& traits);

// TensorSegment::step of a segment that takes the call's step (CompressContext::step).
inline constexpr std::uint64_t kStepOfCall = ~std::uint64_t{0};

// One of the user's tensors inside a compressed tensor (a fusion buffer, or a chunk of one). Its error-feedback
// state (residual, momenta) is keyed by `name` and sized `total`, whatever buffer or chunk carries it, and a codec
// encodes it exactly as it would encode those elements alone under `name` (fusion-invariant compression: k per
// segment, quantizer buckets and random streams that never cross a segment boundary).
struct TensorSegment {
  std::string_view name = {};  // the user's tensor name; must not be empty
  std::size_t offset = 0;      // first element of this segment inside the compressed tensor
  std::size_t numel = 0;       // elements of the named tensor carried here
  std::size_t start = 0;       // where they begin inside the named tensor (a chunk may carry a part of it)
  std::size_t total = 0;       // the named tensor's full element count; 0 means numel (carried whole)
  // The named tensor's first dimension when it has two or more (a matrix of rows x total/rows, PyTorch's view of a
  // weight for PowerSGD); 0 for a vector. Only shape-aware codecs read it.
  std::size_t rows = 0;
  // The named tensor's own training step (random-k's indices and DGC's warm-up follow it), or kStepOfCall: the
  // call's CompressContext::step. Lets tensors reduced a different number of times share one buffer.
  std::uint64_t step = kStepOfCall;
};

// Per-call information. Must be identical on every rank for the same tensor and step (random streams depend on it).
struct CompressContext {
  // Stable tensor name: keys the random streams, and the error-feedback state when `segments` is empty. Must not be
  // empty.
  std::string_view name;
  // The named tensors the compressed tensor is made of, in order, covering it exactly (offsets ascending, no gaps).
  // Empty: the whole tensor is `name`. With segments, error-feedback state is kept per segment name, the non-finite
  // policy applies per segment (raise names the segment's tensor; skip sends zeros for that segment only and leaves
  // its state untouched), and `name` keys only the random streams and per-call diagnostics.
  std::span<const TensorSegment> segments = {};
  // Training step, incremented by the caller once per optimizer step (random-k and DGC warm-up depend on it).
  std::uint64_t step = 0;
  int rank = 0;
  int world_size = 1;
  // Values are multiplied by this before encoding (fp16 uses 1/world_size so a half-precision sum cannot overflow).
  float prescale = 1.0f;
};

// What the last compress() call observed, for logging and stats.
struct CompressStats {
  std::size_t numel = 0;
  std::size_t payload_bytes = 0;
  std::size_t selected = 0;     // elements transmitted (sparsifiers), numel for dense codecs
  std::size_t saturated = 0;    // values clamped to the wire type's range (fp16)
  std::size_t nonfinite = 0;    // NaN/Inf found in the input
  bool skipped = false;         // the step was skipped by the non-finite policy
};

// One reduction in summable rounds (CompressorTraits::rounds), begun by Compressor::begin_rounds() on every rank.
// The driver (compressed_allreduce's rounds algorithm) loops: span = next_round(); if empty, stop; sum the span
// elementwise over the ranks in place (f32); then calls finish(). The spans are memory of the tensor's device, and
// the work producing them is ordered on the tensor's stream: synchronize it before a communicator reads them.
class RoundReduction {
 public:
  virtual ~RoundReduction() = default;
  // The local contribution of the next round (after reading the previous round's sums from the span handed out
  // last), or an empty span when every round is done.
  virtual std::span<float> next_round() = 0;
  // Writes the result into the tensor given to begin_rounds() (the sum over ranks, or the average when
  // `average`) and commits the compressor's state (residuals, factors, steps). Call once, after the last round.
  virtual void finish(bool average) = 0;
  // Payload-equivalent bytes this rank contributed over all rounds (for stats).
  virtual std::size_t sent_bytes() const = 0;
};

// Whether decompress() overwrites its output or adds to it.
enum class DecodeMode { kOverwrite, kAccumulate };

// A payload's bytes and the memory they live in: host memory (what a span alone converts to), or a CUDA device's.
// The caller says where; no codec probes a pointer. A CUDA decode runs on its output's stream: device bytes written
// on another stream must be ordered before the call.
struct PayloadBytes {
  std::span<const std::byte> bytes;
  Memory memory = Memory::host();

  // Host bytes: anything a std::span<const std::byte> can be made from (a span, a std::vector<std::byte>).
  template <typename Bytes>
    requires std::convertible_to<Bytes&&, std::span<const std::byte>>
  PayloadBytes(Bytes&& host_bytes) : bytes(std::forward<Bytes>(host_bytes)) {}  // NOLINT: implicit by design
  PayloadBytes(std::span<const std::byte> bytes_in, Memory where) : bytes(bytes_in), memory(where) {}
};

// A gradient codec with optional error feedback. Instances are stateful and not thread-safe: use one instance per
// thread, or serialize calls. Memory of every span/view is owned by the caller.
class Compressor {
 public:
  virtual ~Compressor() = default;

  // Registry name, e.g. "topk".
  virtual std::string_view name() const = 0;
  // Canonical spec with every parameter spelled out, e.g. "topk:ratio=0.01,ef=on,values=f32". Parsing it yields an
  // equivalent compressor.
  virtual std::string spec() const = 0;
  virtual CompressorTraits traits() const = 0;

  // Upper bound, in bytes, of the payload for a tensor of `numel` elements. Throws InvalidArgument when the codec
  // cannot address that many elements (the sparsifiers' int32 indices: at most 2^31 - 1); compress() asks first, so
  // such a tensor is refused before any state is allocated.
  virtual std::size_t max_payload_bytes(std::size_t numel) const = 0;

  // Upper bound, in bytes, of the payload of a call over `numel` elements made of `segments`
  // (CompressContext::segments; empty = one tensor). Codecs that encode each segment as its own payload inside a
  // segmented container (compressors/framework/segmented_payload.h) need more than max_payload_bytes(numel); callers size
  // compress() buffers with this. The default is max_payload_bytes(numel).
  virtual std::size_t payload_bound(std::size_t numel, std::span<const TensorSegment> segments) const;

  // The bytes one call over a tensor of `numel` elements in `rows` rows (TensorView::rows(); 0: a vector) is expected
  // to send, for cost models such as the hierarchical auto mode's (gradcomp/hierarchy_model.h). The default is
  // max_payload_bytes(numel), which is the payload for codecs whose size depends on the element count only; a codec
  // whose payload depends on the shape (PowerSGD's factors) gives its size for that shape.
  virtual std::size_t expected_payload_bytes(std::size_t numel, std::size_t rows) const;

  // Compresses `grad` into `out` (at least payload_bound(grad.numel(), ctx.segments) bytes, in grad's memory: host
  // memory for a CPU tensor, memory of grad's device for a CUDA tensor, as the caller labelled them; not probed),
  // applying and updating the error-feedback state of `ctx.name` (or of each segment's name). Returns the payload
  // size in bytes.
  // Throws InvalidArgument (bad dtype, small buffer, non-finite input under the "raise" policy, state of another size).
  virtual std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx) = 0;

  // Decodes `payload` into `out` (numel and dtype as compressed). Validates the payload first: a truncated or
  // corrupt one throws CorruptPayload and leaves `out` untouched. A CUDA `out` takes host payloads (staged) and
  // payloads in its device's memory; a CPU `out` takes host payloads only (else InvalidArgument, out untouched).
  virtual void decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) = 0;

  // Decodes several payloads of one tensor into `out`, in order: the first with `first`, the others accumulating;
  // the result of decompress() of each in turn (the default does exactly that). A codec may check every payload
  // before it writes any, and then waits for a device once for all of them instead of per payload (the CUDA path of
  // the built-in codecs: a gathered buffer of n ranks' payloads costs two host waits, not 2n).
  // Each payload says where it lives (as for decompress()).
  virtual void decompress_sum(std::span<const PayloadBytes> payloads, const TensorView& out, DecodeMode first);

  // Serialized state of every tensor name (residuals, momenta, steps). load_state(save_state()) restores it so that
  // the next compress() is bit-identical to an uninterrupted run. load_state throws InvalidArgument for state of
  // another codec, and CorruptPayload for damaged bytes.
  virtual std::vector<std::byte> save_state() const = 0;
  virtual void load_state(std::span<const std::byte> state) = 0;
  // Forgets all per-tensor state.
  virtual void reset_state() = 0;

  // Worker threads for large CPU tensors (0 = all hardware threads, 1 = serial). Results never depend on it.
  virtual void set_threads(int threads) = 0;

  // Statistics of the last compress() call.
  virtual CompressStats last_stats() const = 0;

  // Codecs with traits().rounds: begins a reduction of `tensor` (read now; written by finish()) under `ctx`, whose
  // world_size must be the number of ranks summing the rounds. Validation and the non-finite policy apply here,
  // before any state changes. Others throw InvalidArgument.
  virtual std::unique_ptr<RoundReduction> begin_rounds(const TensorView& tensor, const CompressContext& ctx);
};

// Host convenience: compresses a CPU tensor into a new buffer of exactly the payload's size.
std::vector<std::byte> compress_to_vector(Compressor& compressor, const TensorView& grad, const CompressContext& ctx);

}  // namespace gradcomp
