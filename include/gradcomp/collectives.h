// Compressed collectives: one entry point that picks the algorithm from the compressor's traits.
#pragma once

#include <array>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/hierarchy_model.h"
#include "gradcomp/tensor.h"

namespace gradcomp {

enum class AllreduceAlgorithm { kAuto, kDense, kAllgather, kSparseAllreduce, kScatterReduceAllgather, kRounds };

// "auto", "dense", "allgather", "sparse", "sra", "rounds".
std::string_view algorithm_name(AllreduceAlgorithm algorithm);
// Inverse of algorithm_name; throws InvalidArgument listing the valid names.
AllreduceAlgorithm parse_algorithm(std::string_view name);
// `requested`, or for kAuto the algorithm the traits call for: summable -> dense, gatherable -> sparse allreduce,
// requantizable -> scatter-reduce-allgather, rounds -> rounds, anything else -> allgather.
AllreduceAlgorithm resolve_algorithm(const CompressorTraits& traits, AllreduceAlgorithm requested);
// How a resolved algorithm moves its payloads, as the auto hierarchy's cost model prices it (kDense: kAllreduce).
PayloadExchange payload_exchange(AllreduceAlgorithm algorithm);

// The two levels of a hierarchical allreduce, built once by make_node_groups() and reused across calls.
struct NodeGroups {
  std::unique_ptr<Communicator> node;     // the ranks of this rank's node (never null)
  std::unique_ptr<Communicator> leaders;  // rank 0 of every node; null on the other ranks
  int node_count = 1;
  int per_node = 1;  // ranks of the largest node (set by learn_links)
  LinkModel links;   // the two levels' costs, for AllreduceOptions::hierarchy_auto (set by learn_links)
};

// Collective over `world`: groups its ranks by world.node_color() (GRADCOMP_LOCAL_SIZE=k emulates nodes of k ranks).
NodeGroups make_node_groups(Communicator& world);

// Collective over `world`: learns `groups.links` by timing, one level at a time, the collectives the algorithms run
// there: an allreduce and a broadcast inside each node, an allreduce, allgatherv and alltoallv between the leaders
// and over the world, each at probe_bytes / 4 and probe_bytes per rank (an allgatherv contributes at most
// 16 * probe_bytes / size, at least 64 KiB), priced by the median of three calls of each (the slowest node's and the
// leaders' figures, the same on every rank). Costs 8 collectives x 7 calls; call once.
void learn_links(Communicator& world, NodeGroups& groups, std::size_t probe_bytes = std::size_t{4} << 20);

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kAverage;  // kSum or kAverage
  // kAuto picks from the traits: summable -> dense, gatherable -> sparse allreduce (switching to dense past the
  // break-even density), requantizable -> scatter-reduce-allgather, rounds -> rounds, anything else -> allgather.
  // kDense needs a summable codec and kRounds a rounds codec; the other algorithms work with any codec that can
  // compress the whole tensor (PowerSGD cannot compress the chunks of sra).
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::uint64_t step = 0;
  // Agree on (name, numel, dtype, spec, algorithm, op) before moving data (one small allgather). Turn off only when
  // the caller has negotiated these already (the runtime does).
  bool verify = true;
  // Hierarchical: dense f32 sum inside each node, compressed allreduce between node leaders (the compressor sees node
  // sums and only leaders compress), broadcast inside the node. Uses `nodes` when given, else builds the groups for
  // this call (a collective split: pass `nodes` when calling repeatedly).
  bool hierarchical = false;
  NodeGroups* nodes = nullptr;
  // Auto: each call takes flat or hierarchical, whichever choose_hierarchy() predicts faster from `nodes->links`
  // (needs `nodes` with learned links; overrides `hierarchical`; the same choice on every rank, reported in
  // AllreduceStats::hierarchical).
  bool hierarchy_auto = false;
  // Sparse allreduce switches to a dense f32 allreduce when the payloads of all ranks together exceed
  // sparse_switch_density * 8 * numel bytes. 1.0 is the break-even of an allgather against a dense f32 ring
  // allreduce ((n-1)/n * sum of payloads vs 2(n-1)/n * 4 * numel); with 8-byte (index, value) pairs it is a summed
  // density of 1.
  double sparse_switch_density = 1.0;
  // The user's tensors that make up `tensor` (a fusion buffer or a DDP bucket), in order and covering it exactly
  // (see TensorSegment): each keeps its own error-feedback state under its own name, whatever the grouping, chunking
  // (scatter-reduce-allgather) or algorithm. Empty: the whole tensor is `name`. Not copied: must outlive the call.
  std::span<const TensorSegment> segments = {};
};

// What one compressed allreduce did.
struct AllreduceStats {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;  // the algorithm that ran (never kAuto)
  std::size_t input_bytes = 0;    // uncompressed bytes of the tensor
  std::size_t payload_bytes = 0;  // this rank's compressed payload (sum over chunks for SRA)
  // Bytes this rank sends under bandwidth-optimal (ring) schedules, see docs/comm.md: dense 2(n-1)/n * body,
  // allgatherv (n-1)/n * sum of payloads, alltoallv the bytes sent to other ranks.
  std::size_t wire_bytes = 0;
  bool switched_to_dense = false;  // sparse allreduce went dense
  std::size_t union_nnz = 0;       // sparse allreduce: nonzeros of the aggregated result (0 when it went dense)
  bool hierarchical = false;
  // Bytes copied between device and host because the communicator cannot take device memory (a CUDA tensor on a
  // communicator that does not take the tensor's device: staged once each way per call); 0 on the device-resident path.
  std::size_t staged_bytes = 0;
  // Blocks of working memory this call obtained from the system (a miss of gradcomp's per-thread pools: payload and
  // gather buffers, counters, codec workspaces that grew, communicator staging) and times the calling thread waited
  // for a device stream. After the first call of a shape both are the steady-state figures the tests pin:
  // allocations 0, synchronizations a small constant per algorithm (the host path counts the waits the device path
  // would make, docs/cuda.md).
  std::size_t allocations = 0;
  std::size_t synchronizations = 0;
  double compress_s = 0, communicate_s = 0, decompress_s = 0;
};

// In place: `tensor` on every rank becomes the average (or sum) over ranks of what each rank's compressor
// transmitted for `name`. Every rank must call it with the same name, numel, dtype and compressor spec; a mismatch
// throws InvalidArgument on every rank naming both sides. All ranks end with bit-identical tensors. A CUDA tensor stays
// on its device (CUDA codec, device payloads, CUDA decode, ordered on the tensor's stream) when
// comm.takes(tensor.device()) (NCCL, torch on NCCL); otherwise it is staged through host memory once per call (the CPU codec path;
// AllreduceStats::staged_bytes). Error-feedback state is keyed by the segment names (or `name`),
// also under scatter-reduce-allgather; the chunk owner's re-quantization keeps its own residual under "<name>#sra".
AllreduceStats compressed_allreduce(Communicator& comm, Compressor& compressor, const TensorView& tensor,
                                    std::string_view name, const AllreduceOptions& options = {});

// Cross-rank agreement, the one check every entry uses (compressed_allreduce's AllreduceOptions::verify, the torch
// bridge's exchange worker, the Python collectives): each rank describes in words what it is about to do (naming the
// tensor); one allgather of a 16-byte fingerprint of the description (FNV-1a 64, then its length), and only on a
// mismatch an exchange of the descriptions. Returns when every rank's fingerprint is equal; otherwise throws
// InvalidArgument on every rank: "<what>: ranks disagree (seen on rank r of n): rank 0 has <rank 0's description>,
// but rank k has <rank k's>", k the first rank that differs from rank 0. A rank that does not take part makes the
// others throw the communicator's Timeout/CommError.
void check_agreement(Communicator& comm, std::string_view what, std::string_view description);
// The fingerprint check_agreement() gathers: equal on two ranks when their descriptions are (up to a 64-bit hash
// collision between descriptions of equal length). Callers that cache a passed check key it by this.
std::array<std::byte, 16> agreement_fingerprint(std::string_view description);

}  // namespace gradcomp
