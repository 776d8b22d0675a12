// Internals of compressed_allreduce: one function per algorithm over a host tensor, and the helpers they share.
// The public entry point (comm/algorithms/compressed_allreduce.cc) verifies cross-rank agreement, stages device
// tensors, handles the hierarchical mode and dispatches here.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "comm/algorithms/memory_space.h"
#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/tensor.h"

namespace gradcomp::algorithms {

// The payloads an allgather exchanged (run_allgather, or run_sparse below its dense switch): packed in rank order, each
// in a padded slot (kPayloadAlign), and their sizes. Decoding them in rank order gives the call's sum bit for bit.
struct GatheredPayloads {
  Bytes packed = Bytes(0);
  std::vector<std::size_t> sizes;  // empty: the sum was not decoded from gathered payloads (dense switch, other algorithms)
};

// One compressed allreduce in progress. `tensor` and every working buffer live in `space` (host memory, or the
// tensor's CUDA device when the communicator takes device memory).
struct Call {
  Communicator& comm;
  MemorySpace& space;
  Compressor& compressor;
  TensorView tensor;
  std::string_view name;
  const AllreduceOptions& options;
  AllreduceStats& stats;
  // When set (the hierarchical mode's leaders), the allgather algorithms leave their payloads here after decoding, so
  // the other ranks of a node can decode the same bytes instead of receiving the f32 sum.
  GatheredPayloads* keep_gathered = nullptr;
};

// summable codecs only: compress with prescale 1/n (kAverage), sum the payload bodies as the wire dtype, decompress.
void run_dense(Call& call);
// The dense algorithm over the tensor that `parts` (host memory, one dtype, one per options.segments entry, in order)
// make end to end, without that tensor: the codec (a GatherCodec that gathers: none, fp16, bf16) encodes each part
// straight into the payload (on a communicator with its own buffers, OwnedBufferAllreduce, into its send buffer) and
// decodes the sum straight into the parts. Bits and codec state are those of compressed_allreduce() of the laid-out
// tensor. For negotiated calls: throws InvalidArgument unless options.verify is off and the algorithm resolves to
// the flat dense one; otherwise throws as compressed_allreduce() does.
AllreduceStats dense_allreduce_parts(Communicator& comm, Compressor& compressor, std::span<const TensorView> parts,
                                     std::string_view name, const AllreduceOptions& options);
// allgatherv of every rank's payload, then decompress-and-add in rank order.
void run_allgather(Call& call);
// allgatherv of the payloads and decode-and-add in rank order while the summed payload bytes stay below
// options.sparse_switch_density * 8 * numel; past that, every rank decodes its own and the decoded tensors are summed in
// rank order (ordered_sum_f32; SparCML's switch).
void run_sparse(Call& call);
// scatter-reduce-allgather over `size` chunks with requantization by the chunk owner.
void run_scatter_reduce_allgather(Call& call);
// rounds codecs only (PowerSGD): the codec's RoundReduction, each round's f32 contribution summed over the ranks
// (ordered_sum_f32).
void run_rounds(Call& call);

// Throws InvalidArgument on every rank unless all ranks call with the same describe_allreduce() (name, numel, dtype,
// spec, algorithm, op, hierarchical, segments): check_agreement() of verify.h.
void verify_agreement(Communicator& comm, const Compressor& compressor, const TensorView& tensor, std::string_view name,
                      const AllreduceOptions& options);

// ---- helpers ----

// Throws InvalidArgument naming the tensor, the codec's spec and traits unless `ok`: the `algorithm` needs `kind`
// (e.g. "a summable codec"); `instead` lists the algorithms to use.
void require_codec(const Call& call, bool ok, std::string_view algorithm, std::string_view kind,
                   std::string_view instead);

// The context compress() gets for `name` in this call (step from options, rank/size from comm).
CompressContext compress_context(const Call& call, std::string_view name, float prescale,
                                 std::span<const TensorSegment> segments = {});

// Payloads travel packed in one buffer (allgatherv, alltoallv), each starting at a multiple of kPayloadAlign bytes:
// the device decoders load int32 indices and float4 groups from the sections, which a payload of odd length (top-k
// with f16 values and odd k) would misalign for the next rank's payload. The padding (zeros) travels too.
inline constexpr std::size_t kPayloadAlign = 16;
// `bytes` rounded up to kPayloadAlign: a payload's slot in a packed buffer.
inline std::size_t padded_bytes(std::size_t bytes) { return (bytes + kPayloadAlign - 1) / kPayloadAlign * kPayloadAlign; }
// The slots of payloads of `sizes` bytes packed back to back.
std::vector<std::size_t> padded_counts(std::span<const std::size_t> sizes);

// Compresses `part` under `name` (ctx.step from options, rank/size from comm); the buffer's size() is the payload's
// and its padding up to padded_bytes(size()) is zeroed (so the padded slot can be sent). Adds the time to
// stats.compress_s. `segments` (see TensorSegment) key its error-feedback state; empty: `name`.
Bytes compress_part(Call& call, const TensorView& part, std::string_view name, float prescale,
                    std::span<const TensorSegment> segments = {});

// compress_part of the call's whole tensor under call.name with the call's segments (no prescale); its size is
// counted in stats.payload_bytes.
Bytes compress_own(Call& call);

// Allgatherv of every rank's `payload` (from compress_part, in call.space) into one buffer of call.space, each rank's
// in a padded slot (kPayloadAlign): returns it and fills `sizes` (payload bytes per rank). Synchronizes the space
// first, so the communicator sees finished payloads.
Bytes allgather_payloads(Call& call, const Bytes& payload, std::vector<std::size_t>& sizes);
// The same when every rank's payload size is already known (`sizes`, bytes per rank, equal on every rank).
Bytes allgatherv_payloads(Call& call, const Bytes& payload, const std::vector<std::size_t>& sizes);

// Decompresses packed payloads (`sizes[r]` bytes from rank r, in rank order, each in a padded slot) into `sum`:
// rank 0's overwrites, the others accumulate. Every rank sums in the same order, so the result is bit-identical on
// every rank.
void decode_in_rank_order(Call& call, std::span<const std::byte> all, std::span<const std::size_t> sizes,
                          const TensorView& sum);

// An f32 working tensor of the call's numel in call.space: the tensor itself when it is f32 (its values were consumed
// by compress()), else a new buffer (`holder` keeps it).
float* f32_sum_buffer(Call& call, Bytes& holder);

// Element i*numel/n of numel: where piece i of n of a tensor (or buffer) begins.
std::size_t piece_begin(std::size_t numel, int i, int n);

// Sums `numel` f32 values at `values` (in call.space) over the ranks in place, every element added in rank order
// ((x_0 + x_1) + ... + x_{n-1}) whatever its position in the buffer: the buffer is cut into n pieces, piece i summed by
// rank i from everyone's (alltoallv), and the sums allgathered. The bits therefore do not depend on how tensors were
// fused into the buffer, and equal a decode-and-add in rank order. 2(n-1)/n of the buffer on the wire per rank, as a
// ring; adds the bytes and the time to call.stats.
void ordered_sum_f32(Call& call, float* values, std::size_t numel);

// Bytes one rank sends in a ring allreduce of `bytes` over n ranks: 2(n-1)/n * bytes.
std::size_t ring_allreduce_bytes(std::size_t bytes, int n);
// Bytes one rank sends in a ring allgather of blocks totalling `total` over n ranks: (n-1)/n * total.
std::size_t ring_allgather_bytes(std::size_t total, int n);

// Allgather of one u64 per rank.
std::vector<std::uint64_t> allgather_u64(Communicator& comm, std::uint64_t value);

// Seconds since construction, added to a stats field on stop().
class Stopwatch {
 public:
  explicit Stopwatch(double& sink) : sink_(sink), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { stop(); }
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& sink_;
  std::chrono::steady_clock::time_point start_;
  bool stopped_ = false;
};

}  // namespace gradcomp::algorithms
