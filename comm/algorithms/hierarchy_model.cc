// The hierarchical `auto` mode: learning the two levels' link costs (learn_links) and choosing a mode per call
// (choose_hierarchy).
#include "gradcomp/hierarchy_model.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"

namespace gradcomp {

namespace {

// Seconds of one collective of the codec's flat algorithm over `n` ranks whose every step crosses `link`.
double flat_time(const LinkCost& link, int n, const CompressorTraits& traits, std::size_t payload_bytes) {
  if (n <= 1) return 0;
  const double steps_ring = 2.0 * (n - 1);
  if (traits.gatherable || (!traits.summable && !traits.requantizable && !traits.rounds)) {
    return (n - 1) * link.time(static_cast<double>(payload_bytes));  // allgather: n-1 steps of one payload
  }
  return steps_ring * link.time(static_cast<double>(payload_bytes) / n);  // ring: 2(n-1) steps of payload/n
}

// One timed allreduce of `values` floats on `comm`: seconds, the fastest of `repeats`.
double time_allreduce(Communicator& comm, std::vector<float>& buffer, int repeats) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    comm.allreduce(TensorView(buffer.data(), buffer.size(), DType::kF32), ReduceOp::kSum);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The link cost of a ring allreduce on `comm` (k ranks: 2(k-1) steps of S/k bytes), from a small and a large probe.
LinkCost measure_ring(Communicator& comm, std::size_t probe_bytes) {
  const int k = comm.size();
  if (k <= 1) return {};
  std::vector<float> small(2, 1.0f);
  std::vector<float> large(std::max<std::size_t>(probe_bytes / sizeof(float), 1024), 1.0f);
  time_allreduce(comm, large, 1);  // warm-up: connections, buffers
  const double t_small = time_allreduce(comm, small, 5);
  const double t_large = time_allreduce(comm, large, 3);
  const double steps = 2.0 * (k - 1);
  LinkCost cost;
  cost.latency_s = t_small / steps;
  const double moved = steps * static_cast<double>(large.size() * sizeof(float)) / k;
  cost.bytes_per_s = moved / std::max(t_large - t_small, 1e-9);
  return cost;
}

}  // namespace

HierarchyChoice choose_hierarchy(const LinkModel& links, const HierarchyShape& shape, const CompressorTraits& traits,
                                 std::size_t numel, std::size_t payload_bytes) {
  HierarchyChoice choice;
  choice.flat_s = flat_time(links.inter, shape.world, traits, payload_bytes);
  const int k = shape.per_node;
  const double dense_bytes = 4.0 * static_cast<double>(numel);
  double intra = 0;
  if (k > 1) {
    intra = 2.0 * (k - 1) * links.intra.time(dense_bytes / k)  // ring allreduce of the f32 tensor in the node
            + links.intra.time(dense_bytes);                    // broadcast of the result in the node
  }
  choice.hierarchical_s = intra + flat_time(links.inter, shape.nodes, traits, payload_bytes);
  choice.hierarchical = links.measured && shape.nodes > 1 && k > 1 && choice.hierarchical_s < choice.flat_s;
  return choice;
}

void learn_links(Communicator& world, NodeGroups& groups, std::size_t probe_bytes) {
  GRADCOMP_CHECK(groups.node != nullptr, "learn_links: NodeGroups without a node communicator (rank {})", world.rank());
  LinkCost intra = measure_ring(*groups.node, probe_bytes);
  world.barrier();  // the leaders' probe must not share links with a node's probe still running
  LinkCost inter;
  if (groups.leaders != nullptr) inter = measure_ring(*groups.leaders, probe_bytes);
  // Every rank takes the slowest node's and the leaders' figures: latencies and seconds per byte, maxima over ranks.
  std::array<float, 4> costs = {
      static_cast<float>(intra.latency_s), static_cast<float>(intra.bytes_per_s > 0 ? 1.0 / intra.bytes_per_s : 0),
      static_cast<float>(inter.latency_s), static_cast<float>(inter.bytes_per_s > 0 ? 1.0 / inter.bytes_per_s : 0)};
  world.allreduce(TensorView(costs.data(), costs.size(), DType::kF32), ReduceOp::kMax);
  groups.links.intra = {costs[0], costs[1] > 0 ? 1.0 / costs[1] : 0};
  groups.links.inter = {costs[2], costs[3] > 0 ? 1.0 / costs[3] : 0};
  groups.links.measured = true;
  std::int32_t per_node = groups.node->size();
  world.allreduce(TensorView(&per_node, 1, DType::kI32), ReduceOp::kMax);
  groups.per_node = per_node;
}

}  // namespace gradcomp
