// compressed_allreduce: agreement check, device staging, hierarchical mode, and the choice of algorithm.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "kernels/usage_counters.h"

namespace gradcomp {

std::string_view algorithm_name(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto: return "auto";
    case AllreduceAlgorithm::kDense: return "dense";
    case AllreduceAlgorithm::kAllgather: return "allgather";
    case AllreduceAlgorithm::kSparseAllreduce: return "sparse";
    case AllreduceAlgorithm::kScatterReduceAllgather: return "sra";
    case AllreduceAlgorithm::kRounds: return "rounds";
  }
  return "unknown";
}

AllreduceAlgorithm parse_algorithm(std::string_view name) {
  for (auto algorithm : {AllreduceAlgorithm::kAuto, AllreduceAlgorithm::kDense, AllreduceAlgorithm::kAllgather,
                         AllreduceAlgorithm::kSparseAllreduce, AllreduceAlgorithm::kScatterReduceAllgather,
                         AllreduceAlgorithm::kRounds}) {
    if (algorithm_name(algorithm) == name) return algorithm;
  }
  throw InvalidArgument(fmt::format(
      "unknown allreduce algorithm '{}' (valid: auto, dense, allgather, sparse, sra, rounds)", name));
}

AllreduceAlgorithm resolve_algorithm(const CompressorTraits& traits, AllreduceAlgorithm requested) {
  if (requested != AllreduceAlgorithm::kAuto) return requested;
  if (traits.summable) return AllreduceAlgorithm::kDense;
  if (traits.gatherable) return AllreduceAlgorithm::kSparseAllreduce;
  if (traits.requantizable) return AllreduceAlgorithm::kScatterReduceAllgather;
  if (traits.rounds) return AllreduceAlgorithm::kRounds;
  return AllreduceAlgorithm::kAllgather;
}

PayloadExchange payload_exchange(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAllgather: return PayloadExchange::kAllgather;
    case AllreduceAlgorithm::kSparseAllreduce: return PayloadExchange::kSparse;
    case AllreduceAlgorithm::kScatterReduceAllgather: return PayloadExchange::kScatterReduceAllgather;
    case AllreduceAlgorithm::kRounds: return PayloadExchange::kRounds;
    case AllreduceAlgorithm::kDense:
    case AllreduceAlgorithm::kAuto: break;
  }
  return PayloadExchange::kAllreduce;
}

NodeGroups make_node_groups(Communicator& world) {
  NodeGroups groups;
  const int color = world.node_color();
  GRADCOMP_CHECK(color >= 0, "make_node_groups: node color must be >= 0, got {} on rank {}", color, world.rank());
  groups.node = world.split(color, world.rank());
  const bool leader = groups.node->rank() == 0;
  groups.leaders = world.split(leader ? 0 : -1, world.rank());
  std::int32_t leaders = leader ? 1 : 0;
  world.allreduce(TensorView(&leaders, 1, DType::kI32), ReduceOp::kSum);
  groups.node_count = leaders;
  return groups;
}

namespace {

void run_flat(Communicator& comm, algorithms::MemorySpace& space, Compressor& compressor, const TensorView& tensor,
              std::string_view name, const AllreduceOptions& options, AllreduceStats& stats,
              algorithms::GatheredPayloads* keep_gathered = nullptr) {
  stats.algorithm = resolve_algorithm(compressor.traits(), options.algorithm);
  algorithms::Call call{comm, space, compressor, tensor, name, options, stats, keep_gathered};
  switch (stats.algorithm) {
    case AllreduceAlgorithm::kDense: algorithms::run_dense(call); break;
    case AllreduceAlgorithm::kAllgather: algorithms::run_allgather(call); break;
    case AllreduceAlgorithm::kSparseAllreduce: algorithms::run_sparse(call); break;
    case AllreduceAlgorithm::kScatterReduceAllgather: algorithms::run_scatter_reduce_allgather(call); break;
    case AllreduceAlgorithm::kRounds: algorithms::run_rounds(call); break;
    case AllreduceAlgorithm::kAuto: GRADCOMP_ASSERT(false, "unresolved algorithm");
  }
}

// The node's last step: its leader (node rank 0) broadcasts what the other ranks need to hold the leaders' result in
// `work`: the payloads the leaders allgathered, when their sum was decoded from them (each rank then decodes the same
// bytes in the same order: the leader's bits; a top-k or DGC payload is far smaller than the f32 tensor), else the
// f32 sum itself.
void broadcast_node_result(const NodeGroups& groups, algorithms::MemorySpace& space, Compressor& compressor,
                           const TensorView& work_view, std::string_view name, const AllreduceOptions& options,
                           AllreduceStats& stats, algorithms::GatheredPayloads& gathered) {
  Communicator& node = *groups.node;
  const bool leader = node.rank() == 0;
  const std::size_t numel = work_view.numel();
  // Only the allgather algorithms can hand on payloads, so only they say which follows: [packed bytes (0: the f32
  // sum), each leader's payload size]. Every rank knows the algorithm; the others' f32 sum follows at once.
  const AllreduceAlgorithm algorithm = resolve_algorithm(compressor.traits(), options.algorithm);
  std::vector<std::uint64_t> shape;
  if (algorithm == AllreduceAlgorithm::kAllgather || algorithm == AllreduceAlgorithm::kSparseAllreduce) {
    const auto leaders = static_cast<std::size_t>(groups.node_count);
    shape.assign(1 + leaders, 0);
    if (leader && !gathered.sizes.empty()) {
      GRADCOMP_ASSERT(gathered.sizes.size() == leaders, "'{}': {} gathered payloads from {} leaders", name,
                      gathered.sizes.size(), leaders);
      shape[0] = gathered.packed.size();
      std::copy(gathered.sizes.begin(), gathered.sizes.end(), shape.begin() + 1);
    }
    algorithms::Stopwatch watch(stats.communicate_s);
    node.broadcast(std::as_writable_bytes(std::span(shape)), 0);
  }
  if (shape.empty() || shape[0] == 0) {
    algorithms::Stopwatch watch(stats.communicate_s);
    space.synchronize();
    node.broadcast(std::span<std::byte>(static_cast<std::byte*>(work_view.data()), numel * sizeof(float)), 0,
                   space.memory());
    if (leader) stats.wire_bytes += numel * sizeof(float);
    return;
  }
  if (!leader) gathered.packed = space.allocate(shape[0]);
  {
    algorithms::Stopwatch watch(stats.communicate_s);
    space.synchronize();
    node.broadcast(std::span<std::byte>(gathered.packed.data(), shape[0]), 0, space.memory());
  }
  if (leader) {
    stats.wire_bytes += shape[0] + shape.size() * sizeof(std::uint64_t);
    return;  // its work already holds the decoded sum
  }
  const std::vector<std::size_t> payload_sizes(shape.begin() + 1, shape.end());
  algorithms::Call call{node, space, compressor, work_view, name, options, stats};
  algorithms::Stopwatch watch(stats.decompress_s);
  algorithms::decode_in_rank_order(call, {gathered.packed.data(), shape[0]}, payload_sizes, work_view);
}

// Dense f32 sum inside the node, compressed allreduce of the node sums between leaders, then inside the node the
// leaders' payloads (allgather algorithms) or their f32 result (broadcast_node_result).
void run_hierarchical(Communicator& comm, algorithms::MemorySpace& space, Compressor& compressor,
                      const TensorView& tensor, std::string_view name, const AllreduceOptions& options,
                      AllreduceStats& stats) {
  NodeGroups built;
  NodeGroups* groups = options.nodes;
  if (groups == nullptr) {
    built = make_node_groups(comm);
    groups = &built;
  }
  GRADCOMP_CHECK(groups->node != nullptr, "compressed_allreduce('{}'): NodeGroups without a node communicator", name);
  const std::size_t numel = tensor.numel();
  algorithms::Bytes work_bytes = space.allocate(numel * sizeof(float));
  auto* work = reinterpret_cast<float*>(work_bytes.data());
  const TensorView work_view = space.view(work, numel, DType::kF32).with_rows(tensor.rows());
  algorithms::GatheredPayloads gathered;  // the leaders' allgathered payloads, when their algorithm gathers
  space.load_f32(tensor, work);
  {
    algorithms::Stopwatch watch(stats.communicate_s);
    groups->node->allreduce(work_view, ReduceOp::kSum);
  }
  stats.wire_bytes += algorithms::ring_allreduce_bytes(numel * sizeof(float), groups->node->size());
  if (options.op == ReduceOp::kAverage) {
    // Leaders then sum node averages-to-be: the world average.
    space.divide(work, numel, static_cast<float>(comm.size()), false);
  }
  if (groups->leaders != nullptr) {
    AllreduceOptions inner = options;
    inner.op = ReduceOp::kSum;
    inner.hierarchical = false;
    inner.nodes = nullptr;
    inner.verify = false;  // the world agreed already
    run_flat(*groups->leaders, space, compressor, work_view, name, inner, stats, &gathered);
  } else {
    stats.algorithm = resolve_algorithm(compressor.traits(), options.algorithm);
  }
  broadcast_node_result(*groups, space, compressor, work_view, name, options, stats, gathered);
  space.store_f32(work, tensor);
}

}  // namespace

namespace {

AllreduceStats run_call(Communicator& comm, Compressor& compressor, const TensorView& tensor,
                                   std::string_view name, const AllreduceOptions& options);

}  // namespace

AllreduceStats compressed_allreduce(Communicator& comm, Compressor& compressor, const TensorView& tensor,
                                    std::string_view name, const AllreduceOptions& options) {
  // Everything below runs on the tensor's device, whatever the calling thread had chosen (a worker thread that never
  // called cudaSetDevice would otherwise stage through GPU 0's legacy stream and create a context there).
  const DeviceScope device(tensor.device());
  const kernels::UsageCounts before = kernels::thread_usage();
  AllreduceStats stats = run_call(comm, compressor, tensor, name, options);
  const kernels::UsageCounts& after = kernels::thread_usage();
  stats.allocations = after.allocations - before.allocations;
  stats.synchronizations = after.synchronizations - before.synchronizations;
  return stats;
}

namespace {

AllreduceStats run_call(Communicator& comm, Compressor& compressor, const TensorView& tensor,
                                   std::string_view name, const AllreduceOptions& options) {
  GRADCOMP_CHECK(!name.empty(), "compressed_allreduce: the tensor name must not be empty (rank {})", comm.rank());
  GRADCOMP_CHECK(options.op == ReduceOp::kSum || options.op == ReduceOp::kAverage,
                 "compressed_allreduce('{}'): op must be sum or average, got {}", name, reduce_op_name(options.op));
  GRADCOMP_CHECK(tensor.dtype() == DType::kF32 || tensor.dtype() == DType::kF16 || tensor.dtype() == DType::kBF16,
                 "compressed_allreduce('{}'): tensor must be f32, f16 or bf16, got {} on rank {}", name,
                 tensor.describe(), comm.rank());
  GRADCOMP_CHECK(options.sparse_switch_density >= 0, "compressed_allreduce('{}'): sparse_switch_density must be >= 0",
                 name);
  AllreduceStats stats;
  stats.input_bytes = tensor.bytes();
  stats.hierarchical = options.hierarchical;
  if (options.hierarchy_auto) {
    GRADCOMP_CHECK(options.nodes != nullptr && options.nodes->links.measured,
                   "compressed_allreduce('{}'): the auto hierarchy needs NodeGroups whose links were learned "
                   "(learn_links) on rank {}", name, comm.rank());
    const NodeGroups& nodes = *options.nodes;
    const AllreduceAlgorithm algorithm = resolve_algorithm(compressor.traits(), options.algorithm);
    const CostedCall call{payload_exchange(algorithm), tensor.numel(),
                          compressor.expected_payload_bytes(tensor.numel(), tensor.rows()),
                          options.sparse_switch_density};
    const HierarchyChoice choice =
        choose_hierarchy(nodes.links, {comm.size(), nodes.node_count, nodes.per_node}, call);
    AllreduceOptions decided = options;
    decided.hierarchy_auto = false;
    decided.hierarchical = choice.hierarchical;
    return run_call(comm, compressor, tensor, name, decided);
  }
  if (options.verify) {
    algorithms::Stopwatch watch(stats.communicate_s);
    algorithms::verify_agreement(comm, compressor, tensor, name, options);
  }
  if (!comm.takes(tensor.device())) {
    // This communicator cannot take the tensor's device memory (MPI, torch on gloo): stage the whole tensor once, run
    // on the host (CPU codec path), copy the result back; counted in the stats.
    AllreduceOptions inner = options;
    inner.verify = false;
    AllreduceStats inner_stats;
    const std::size_t staged = with_memory_taken(comm, tensor, [&](const TensorView& host) {
      inner_stats = run_call(comm, compressor, host, name, inner);
    });
    inner_stats.communicate_s += stats.communicate_s;
    inner_stats.staged_bytes += staged;
    return inner_stats;
  }
  // Host tensors work in host memory; device tensors stay on their device (CUDA codec, device payloads, the
  // communicator on device memory, CUDA decode), ordered on the tensor's stream.
  std::unique_ptr<algorithms::MemorySpace> device_space;
  if (tensor.device().is_cuda()) device_space = algorithms::cuda_space(tensor);
  algorithms::MemorySpace& space = device_space ? *device_space : algorithms::host_space();
  if (options.hierarchical) {
    run_hierarchical(comm, space, compressor, tensor, name, options, stats);
  } else {
    run_flat(comm, space, compressor, tensor, name, options, stats);
  }
  space.synchronize();
  return stats;
}

}  // namespace

}  // namespace gradcomp
