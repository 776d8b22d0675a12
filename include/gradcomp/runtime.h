// Runtime: a Horovod-style tensor-fusion engine over one Communicator. The caller enqueues named gradients from any
// thread; a background thread negotiates with the other ranks which names are ready everywhere, packs ready tensors
// of the same dtype, device and compression spec into a fusion buffer, runs one compressed allreduce per buffer and
// scatters the results back into the callers' tensors. Error-feedback residuals are kept per tensor name, so they
// are right whatever the fusion threshold or the arrival order. No process-wide state: every Runtime owns its
// thread, buffers, compressors and timeline; several can live in one process on different communicators.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/state_envelope.h"  // save_state()'s envelope and state_checksum
#include "gradcomp/tensor.h"

namespace gradcomp {

// One policy rule: tensors whose name matches the glob `pattern` ('*' any run, '?' one character, anything else
// literal) use `spec` (a compressor spec such as "topk:ratio=0.01", or "auto").
struct PolicyRule {
  std::string pattern;
  std::string spec;
};

// Which compressor a tensor gets when allreduce_async() is called without an explicit spec.
struct CompressionPolicy {
  // Tried in order; the first match wins.
  std::vector<PolicyRule> rules;
  // Spec for names no rule matches.
  std::string default_spec = "none";
  // Tensors of fewer bytes than this go dense ("none") whatever the rules say (0 = no minimum).
  std::size_t min_compress_bytes = 0;
  // Candidates of the "auto" spec. Per fused buffer the runtime predicts, for each candidate and for "none",
  // input_bytes / compress throughput + wire bytes / link bandwidth + decompress time, and takes the smallest.
  std::vector<std::string> auto_candidates = {"topk:ratio=0.01"};
};

// Fusion threshold from GRADCOMP_FUSION_THRESHOLD (bytes), else 64 MiB.
std::size_t default_fusion_threshold();
// Largest tensor copied into a fusion buffer, from GRADCOMP_FUSION_TENSOR_LIMIT (bytes), else 1 MiB.
std::size_t default_fusion_tensor_limit();
// Timeline path from GRADCOMP_TIMELINE, else "" (no timeline).
std::string default_timeline_path();
// Cycle time from GRADCOMP_CYCLE_TIME_MS, else 1 ms.
double default_cycle_time_ms();
// Longest idle cycle from GRADCOMP_IDLE_CYCLE_MAX_MS, else 50 ms (0 = never back off).
double default_idle_cycle_max_ms();
// Pipeline lanes from GRADCOMP_PIPELINE_LANES, else 2 (0 = fusion buffers run on the negotiation thread).
int default_pipeline_lanes();
// Zero-copy fusion from GRADCOMP_FUSION_GATHER (1 or 0), else on.
bool default_fusion_gather();
// Partition size from GRADCOMP_PARTITION_BYTES (bytes), else 16 MiB (0 = never partition).
std::size_t default_partition_bytes();

struct RuntimeOptions {
  // Period of the negotiation cycle, milliseconds.
  double cycle_time_ms = default_cycle_time_ms();
  // Idle back-off, milliseconds: after every rank reported an empty cycle (no tensor pending anywhere), the next
  // cycle waits twice as long, up to this cap; any pending tensor returns every rank to cycle_time_ms at once, and a
  // local enqueue wakes a backed-off thread immediately. A rank with nothing to submit joins a cycle that another
  // rank started up to this long late (ranks that submit wake at once). 0 disables the back-off. Default from
  // GRADCOMP_IDLE_CYCLE_MAX_MS, else 50 (a value outside [0, 1e9] there throws InvalidArgument). What an idle
  // runtime costs in CPU per cap: docs/runtime.md, "Idle back-off".
  double idle_cycle_max_ms = default_idle_cycle_max_ms();
  // Largest fusion buffer, bytes. Tensors at least this large travel alone; 0 disables fusion.
  std::size_t fusion_threshold_bytes = default_fusion_threshold();
  // Tensors larger than this (bytes) are never copied into a fusion buffer: they travel alone, in place, where the
  // copies in and out would cost more than the per-message latency fusion saves (0 = no limit, Horovod's
  // behaviour). Default from GRADCOMP_FUSION_TENSOR_LIMIT, else 1 MiB (measured: docs/performance.md, "Tensor
  // fusion").
  std::size_t fusion_tensor_limit_bytes = default_fusion_tensor_limit();
  // Pipelining: fusion buffers run on this many lanes (threads, each with its own communicator split from the
  // runtime's), buffer b on lane b mod lanes, beside the negotiation thread: while buffer i is on the wire, buffer
  // i+1 is packed and compressed and buffer i-1 decoded and unpacked, and the next cycle is negotiated. Every
  // tensor's result is bit-identical to the unpipelined path's. 0 = every buffer runs on the negotiation thread, one
  // after another (also what a communicator that cannot take calls from several threads gets: MPI without
  // MPI_THREAD_MULTIPLE, a torch ProcessGroup). Default from GRADCOMP_PIPELINE_LANES, else 2.
  int pipeline_lanes = default_pipeline_lanes();
  // Zero-copy fusion: a fused buffer of host tensors whose codec encodes parts (none, fp16, bf16 under the dense
  // algorithm) is encoded straight from the members' memory into the payload (on MPI: the communicator's own send
  // buffer) and decoded straight into them, with no fusion buffer (BufferRecord::gathered, copy_bytes 0). The bits are
  // the same either way; off copies the members into a fusion buffer and back, as every other codec does (kept for
  // comparison: bench/comm/fusion_bench --no-gather). Default from GRADCOMP_FUSION_GATHER, else on.
  bool fusion_gather = default_fusion_gather();
  // Partitioning: a host tensor that travels alone, of at least twice this many bytes, under a codec that encodes
  // an element range as it encodes the whole tensor (none, fp16, bf16 under the dense algorithm; not with
  // nonfinite=skip, which zeroes a whole tensor), is reduced in ceil(bytes / partition_bytes) parts, each its own
  // buffer on the pipeline's lanes: while one part is on the wire the next is encoded and the one before decoded,
  // so a large gradient's copies into and out of the communicator's buffers hide behind its own communication.
  // Every element gets what it gets unpartitioned (error feedback is kept per element of the tensor's name; a dense
  // sum at 3+ ranks may round differently where MPI's reduction order depends on an element's position, as with
  // fusion). The tensor's handle completes when its last part has, failed by any part's error; the parts that did
  // not fail are reduced (a NaN under nonfinite=raise leaves a whole tensor and its error feedback untouched, a
  // partitioned one only in the part that holds it). Decided from the negotiated signature, so a joined rank cuts a
  // tensor as the others do; like every option it must be equal on every rank. Needs two or more pipeline lanes
  // (else off); 0 = off. Default from GRADCOMP_PARTITION_BYTES, else 16 MiB.
  std::size_t partition_bytes = default_partition_bytes();
  CompressionPolicy policy;
  // Chrome-trace JSON output ("" = none). "{rank}" in the path is replaced by the rank; without it only rank 0
  // writes. The file is complete (valid JSON) once the runtime has shut down.
  std::string timeline_path = default_timeline_path();
  // Reduction of the tensors submitted without one (see allreduce_async): kAverage or kSum.
  ReduceOp op = ReduceOp::kAverage;
  // Collective algorithm of every buffer (kAuto: chosen from the codec's traits, see collectives.h).
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  // Names remembered by the response cache (one bit each in the steady-state negotiation message).
  std::size_t cache_capacity = 4096;
  // Link bandwidth (bytes/s) assumed by "auto"; 0 = measured at start-up with a dense allreduce.
  double link_bytes_per_s = 0;
  // Wait deadline of wait()/synchronize() and of a tensor that not every rank submits; 0 = the communicator's
  // timeout().
  std::chrono::milliseconds timeout{0};
  // Communicator for the data of CUDA tensors (e.g. make_nccl_communicator(world, local_rank)), over the same ranks
  // in the same order as the runtime's; must outlive the runtime and be used by nobody else while it runs.
  // Negotiation stays on the runtime's communicator. Null: CUDA tensors use the runtime's communicator too (staged
  // through host memory once per fused buffer when it cannot take device memory, see AllreduceStats::staged_bytes).
  Communicator* device_comm = nullptr;
};

// Outcome of one tensor's allreduce. ok() or an exception (a gradcomp::Error subclass) to rethrow.
struct Status {
  std::exception_ptr error;

  bool ok() const { return error == nullptr; }
  // "" when ok, else the exception's what().
  std::string message() const;
  // Throws the stored exception, if any.
  void rethrow() const;
};

// What one allreduce_async() call asks for beyond the name and the tensor; every field is optional.
struct SubmitOptions {
  // Compressor spec ("" = the policy). Ignored when `compressor` is given.
  std::string_view spec = {};
  // kSum or kAverage; unset = RuntimeOptions::op.
  std::optional<ReduceOp> op = std::nullopt;
  // A compressor the caller owns (one per optimizer, per hook, per client): its state (residuals, momenta, steps) is
  // the caller's, never the runtime's, and neither runtime save_state() nor another scope ever sees it. Requires a
  // non-empty `scope`, one compressor per scope; it must outlive every tensor submitted with it and must not be used
  // by anyone else while they are pending. Its spec() is what the ranks negotiate.
  Compressor* compressor = nullptr;
  // The caller's namespace: names are unique per scope, so two owners may both submit "0.weight". The ranks
  // negotiate (scope, name), and only tensors of one scope share a fusion buffer. "" = the runtime's own.
  std::string_view scope = {};
  // The tensor's step for its codec (random-k's indices, DGC's warm-up, stochastic rounding), e.g. the optimizer's
  // step count; unset = how many times this runtime reduced the name before.
  std::optional<std::uint64_t> step = std::nullopt;
};

// Ticket of one allreduce_async() call; pass it to wait() exactly once.
struct Handle {
  std::uint64_t id = 0;
};

// Called on the runtime's background thread when a tensor completes. It must not block on the runtime (no wait,
// synchronize or shutdown); enqueueing more work is fine. Exceptions it throws are reported on stderr and dropped.
using CompletionCallback = std::function<void(const Status&)>;

// One fusion buffer (one data message) executed by the runtime.
struct BufferRecord {
  std::string spec;          // the compressor spec that ran (for "auto", the chosen candidate)
  std::string algorithm;     // "dense", "allgather", "sparse", "sra"
  ReduceOp op = ReduceOp::kAverage;  // every member's (a buffer never mixes ops)
  bool auto_chosen = false;  // picked by the "auto" policy
  double predicted_s = 0;    // auto: predicted time of the chosen candidate
  double dense_predicted_s = 0;  // auto: predicted time of "none"
  std::size_t tensors = 0;
  std::size_t input_bytes = 0;
  std::size_t wire_bytes = 0;
  std::size_t staged_bytes = 0;  // device <-> host copies of a CUDA buffer on a communicator without device memory
  std::size_t allocations = 0;   // working memory the allreduce obtained from the system (AllreduceStats)
  std::size_t copy_bytes = 0;    // bytes the runtime copied into and out of the fusion buffer (0: the tensor alone)
  // Fused without a fusion buffer: the codec (none, fp16, bf16) encoded from and decoded into the members (copy 0).
  bool gathered = false;
  int lane = -1;                 // pipeline lane that ran it (RuntimeOptions::pipeline_lanes); -1: the cycle thread
  double copy_in_s = 0, compress_s = 0, communicate_s = 0, decompress_s = 0, copy_out_s = 0;
};

// Counters since construction or the last take_stats().
struct RuntimeStats {
  std::uint64_t cycles = 0;                   // negotiation cycles
  std::uint64_t busy_cycles = 0;              // cycles that started or failed at least one tensor
  std::uint64_t negotiation_collectives = 0;  // collectives spent negotiating (control rounds)
  std::size_t negotiation_bytes = 0;          // bytes this rank contributed to them
  std::uint64_t tensors = 0;                  // tensors completed (successfully or not)
  std::uint64_t messages = 0;                 // data collectives (one per fusion buffer)
  std::size_t input_bytes = 0;                // uncompressed bytes reduced
  std::size_t wire_bytes = 0;                 // bytes this rank sent for the data
  std::size_t staged_bytes = 0;               // device <-> host staging of CUDA buffers (BufferRecord::staged_bytes)
  std::size_t allocations = 0;                // BufferRecord::allocations summed (0 per step in steady state)
  std::size_t copy_bytes = 0;                 // bytes copied into and out of fusion buffers (fused tensors only)
  std::size_t alone_bytes = 0;                // bytes of tensors reduced alone, in the caller's memory (no copy)
  std::size_t gathered_bytes = 0;             // bytes of fused tensors reduced in the caller's memory (no copy)
  double negotiate_s = 0, queue_s = 0, copy_in_s = 0, compress_s = 0, communicate_s = 0, decompress_s = 0,
         copy_out_s = 0;
  // The last 1024 buffers, oldest first.
  std::vector<BufferRecord> buffers;

  // input_bytes / wire_bytes (0 when nothing was sent).
  double compression_ratio() const;
};

class Runtime {
 public:
  // Starts the background thread. `comm` must outlive the runtime and must not be used by anyone else while the
  // runtime runs. Every rank of `comm` must construct a Runtime with equal options.
  Runtime(Communicator& comm, RuntimeOptions options = {});
  // shutdown().
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Enqueues an in-place allreduce of `tensor` under `name` (unique among this runtime's pending tensors). `spec`
  // overrides the policy ("" = use the policy). `op`: kSum or kAverage (the sum divided by the world size), unset =
  // RuntimeOptions::op; a sum is computed as a sum (no average scaled back), and only tensors of the same op share a
  // fusion buffer. The tensor's memory must stay valid and untouched until completion.
  // Every rank must submit the same names with the same numel, dtype, spec and op, in any order; a mismatch completes
  // the tensor with InvalidArgument on every rank. CUDA tensors are fused in device memory (per device and stream
  // order of the first member) and stay there (see RuntimeOptions::device_comm). Throws InvalidArgument (bad spec or
  // op, duplicate pending name, a CUDA tensor without a usable CUDA device) or the error that stopped the runtime.
  // An error while a buffer is compressed (a NaN under nonfinite=raise, ...) completes that buffer's tensors with it;
  // only a communication failure (CommError, Timeout) stops the runtime.
  Handle allreduce_async(std::string_view name, const TensorView& tensor, std::string_view spec = {},
                         std::optional<ReduceOp> op = std::nullopt);
  // Same, reporting completion only to `on_done` (no handle to wait on; synchronize() still waits for it).
  void allreduce_async(std::string_view name, const TensorView& tensor, std::string_view spec,
                       CompletionCallback on_done, std::optional<ReduceOp> op = std::nullopt);
  // Same, with every option of SubmitOptions (an owner's compressor and scope, the tensor's step). A tensor the
  // runtime cannot serve (a CUDA tensor without a usable CUDA device, a size its codec cannot address, another
  // compressor for a scope) is refused here with InvalidArgument naming it and the rank; the runtime keeps serving.
  Handle allreduce_async(std::string_view name, const TensorView& tensor, const SubmitOptions& submit);
  void allreduce_async(std::string_view name, const TensorView& tensor, const SubmitOptions& submit,
                       CompletionCallback on_done);

  // Blocks until `handle` completes and rethrows its error. Throws Timeout past the deadline, InvalidArgument for
  // an unknown or already waited handle.
  void wait(Handle handle);
  // True once `handle` completed (wait() then returns at once).
  bool poll(Handle handle) const;
  // Waits for every tensor submitted so far, releases their handles, then rethrows the first error among them.
  void synchronize();

  // Horovod's join for uneven data: this rank has no more tensors to submit. Until every rank has called join(), it
  // takes part in the tensors the others submit with zeros of the negotiated size, dtype and spec (an Average still
  // divides by the world size; a tensor of an owner's scope uses that scope's compressor where this rank has one,
  // else the spec's codec); its own pending tensors complete as usual. Blocks until every rank has joined and returns
  // the rank that joined last (of several joining in the same cycle, the highest). Nothing is added to the runtime's
  // communication until some rank joins: the flag travels in the negotiation message every cycle sends. Zeros are
  // host memory (a CUDA tensor of the others is served with a host tensor; not with RuntimeOptions::device_comm).
  // Throws the error that stopped the runtime, or Error when it shuts down first; InvalidArgument when join() is
  // already running on this rank.
  int join();

  // Starts writing the Chrome-trace timeline to `path` ("{rank}" is replaced by the rank; without it only rank 0
  // writes), closing the one being written, if any. Not collective. Throws InvalidArgument if the file cannot be
  // opened. stop_timeline() closes it (a valid JSON file); later events are dropped until the next start.
  void start_timeline(const std::string& path);
  void stop_timeline();

  // Finishes the work every rank submitted, completes the rest with an error, stops the thread and closes the
  // timeline. Collective: every rank must call it (or destroy its runtime). Idempotent; bounded by the timeout.
  void shutdown();

  // Counters (cumulative) / counters since the last take_stats(), then reset.
  RuntimeStats stats() const;
  RuntimeStats take_stats();

  // Error-feedback residual of `name` (f32, numel elements), empty if the runtime holds none.
  std::vector<float> residual(std::string_view name) const;

  // Checkpoint of this rank's compression state: the state of every compressor instance it created (per-name
  // residuals, DGC momenta, ..., and scatter-reduce-allgather's re-quantization residuals), the per-buffer step
  // counters that feed the codecs' random streams, and the "auto" policy's calibration, in the one state envelope
  // (gradcomp/state_envelope.h: kind "runtime", this rank and world size), versioned and checksummed.
  // States are per rank (residuals differ between ranks): save on every rank, load each rank's own.
  // Legal only while no work is pending on this rank (after synchronize(), before the next allreduce_async(); not
  // from a completion callback): else InvalidArgument. Rethrows the error that stopped the runtime, if any.
  // Does not communicate; other ranks keep running.
  std::vector<std::byte> save_state() const;
  // Replaces this rank's compression state with one from save_state() of a runtime with the same options on a
  // communicator of the same size and at the same rank. A fresh runtime that loads the state on every rank (before
  // any rank submits work) then computes the same bits as the runtime that saved it would have, provided the
  // tensors are grouped into the same fusion buffers (see docs/runtime.md: the grouping follows arrival within
  // cycles). Same preconditions as save_state(). Throws CorruptPayload for damaged or truncated bytes,
  // InvalidArgument for a state of another world size or rank, or of another codec state format; all-or-nothing
  // (on error the runtime is unchanged). Later, allreduce_async() of a name whose loaded residual has another numel
  // or was kept for another spec throws InvalidArgument naming the tensor.
  void load_state(std::span<const std::byte> state);

  // Changes the fusion threshold (bytes; 0 disables fusion) from the next cycle on. Rank 0's value is used by every
  // rank (it travels in the negotiation message), so call it on rank 0, or on every rank alike.
  void set_fusion_threshold(std::size_t bytes);
  std::size_t fusion_threshold() const;

  int rank() const;
  int size() const;
  const RuntimeOptions& options() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradcomp
