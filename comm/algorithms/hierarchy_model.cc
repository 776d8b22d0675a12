// The hierarchical `auto` mode: learning what each level's collectives cost (learn_links) and choosing a mode per
// call (choose_hierarchy).
#include "gradcomp/hierarchy_model.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"

namespace gradcomp {

namespace {

// Seconds of the median of `repeats` calls of `op` on `comm` (each after a barrier). The median, not the fastest: on
// shared cores one lucky call of a level (an intra-node allreduce that had the CPUs to itself) would make that level
// look several times cheaper than it runs (docs/performance-peers.md, "With the MPI ring").
double typical(Communicator& comm, const std::function<void()>& op, int repeats) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    op();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// latency + bytes / bandwidth through a tiny and a `bytes` call.
LinkCost fit(double t_small, double t_large, double bytes) {
  return {t_small, bytes / std::max(t_large - t_small, 1e-9)};
}

LinkCost measure_allreduce(Communicator& comm, std::size_t probe_bytes) {
  if (comm.size() <= 1) return {};
  std::vector<float> small(2, 1.0f), large(std::max<std::size_t>(probe_bytes / sizeof(float), 1024), 1.0f);
  auto run = [&](std::vector<float>& v) {
    return [&comm, &v] { comm.allreduce(TensorView(v.data(), v.size(), DType::kF32), ReduceOp::kSum); };
  };
  typical(comm, run(large), 1);  // warm-up: connections, buffers
  return fit(typical(comm, run(small), 5), typical(comm, run(large), 3), large.size() * sizeof(float));
}

LinkCost measure_allgather(Communicator& comm, std::size_t probe_bytes) {
  if (comm.size() <= 1) return {};
  const std::size_t n = comm.size();
  std::vector<std::byte> small_in(8), small_out(8 * n), large_in(probe_bytes), large_out(probe_bytes * n);
  auto run = [&](std::vector<std::byte>& in, std::vector<std::byte>& out) {
    return [&comm, &in, &out] { comm.allgather(in, out); };
  };
  typical(comm, run(large_in, large_out), 1);
  return fit(typical(comm, run(small_in, small_out), 5), typical(comm, run(large_in, large_out), 3),
             static_cast<double>(probe_bytes));
}

// The call's algorithm on one level: an allgather or an allreduce of the payload.
double algorithm_time(const LinkCost& allreduce, const LinkCost& allgather, bool gathered, std::size_t payload_bytes) {
  return gathered ? allgather.time(static_cast<double>(payload_bytes))
                  : allreduce.time(static_cast<double>(payload_bytes));
}

}  // namespace

HierarchyChoice choose_hierarchy(const LinkModel& links, const HierarchyShape& shape, bool gathered, std::size_t numel,
                                 std::size_t payload_bytes) {
  HierarchyChoice choice;
  choice.flat_s = shape.world > 1
                      ? algorithm_time(links.world_allreduce, links.world_allgather, gathered, payload_bytes)
                      : 0;
  const double dense_bytes = 4.0 * static_cast<double>(numel);
  const double node = shape.per_node > 1 ? 1.5 * links.node_allreduce.time(dense_bytes) : 0;  // sum + broadcast
  const double leaders =
      shape.nodes > 1 ? algorithm_time(links.leader_allreduce, links.leader_allgather, gathered, payload_bytes) : 0;
  choice.hierarchical_s = node + leaders;
  choice.hierarchical =
      links.measured && shape.nodes > 1 && shape.per_node > 1 && choice.hierarchical_s < choice.flat_s;
  return choice;
}

void learn_links(Communicator& world, NodeGroups& groups, std::size_t probe_bytes) {
  GRADCOMP_CHECK(groups.node != nullptr, "learn_links: NodeGroups without a node communicator (rank {})", world.rank());
  LinkModel& m = groups.links;
  m.node_allreduce = measure_allreduce(*groups.node, probe_bytes);
  world.barrier();  // one level at a time: the probes must not share links
  if (groups.leaders != nullptr) {
    m.leader_allreduce = measure_allreduce(*groups.leaders, probe_bytes);
    m.leader_allgather = measure_allgather(*groups.leaders, probe_bytes);
  }
  world.barrier();
  m.world_allreduce = measure_allreduce(world, probe_bytes);
  m.world_allgather = measure_allgather(world, probe_bytes);
  // The same model on every rank: each latency and each seconds-per-byte is the maximum over ranks (the slowest node;
  // the leaders' figures reach the other ranks).
  std::array<LinkCost*, 5> costs = {&m.node_allreduce, &m.leader_allreduce, &m.leader_allgather, &m.world_allreduce,
                                    &m.world_allgather};
  std::array<float, 10> shared{};
  for (std::size_t i = 0; i < costs.size(); ++i) {
    shared[2 * i] = static_cast<float>(costs[i]->latency_s);
    shared[2 * i + 1] = costs[i]->bytes_per_s > 0 ? static_cast<float>(1.0 / costs[i]->bytes_per_s) : 0.0f;
  }
  world.allreduce(TensorView(shared.data(), shared.size(), DType::kF32), ReduceOp::kMax);
  for (std::size_t i = 0; i < costs.size(); ++i) {
    *costs[i] = {shared[2 * i], shared[2 * i + 1] > 0 ? 1.0 / shared[2 * i + 1] : 0};
  }
  std::int32_t per_node = groups.node->size();
  world.allreduce(TensorView(&per_node, 1, DType::kI32), ReduceOp::kMax);
  groups.per_node = per_node;
  m.measured = true;
}

}  // namespace gradcomp
