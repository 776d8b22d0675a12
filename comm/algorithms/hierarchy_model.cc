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

// A probe of one collective: run(bytes) performs it once with `bytes` per rank (as LevelCosts counts them).
using Probe = std::function<void(std::size_t bytes)>;

// A tiny call, a `large / 4` call and a `large` call: the knee at large / 4 and the marginal rate past it. Two large
// sizes, not a tiny one and a large one, for the rate: a large message pays a latency of its own (SMPI's calibrated
// factors multiply a link's latency by ~12 past 64 KiB; rendezvous protocols do the same on real networks), which a
// tiny call does not show and a line through a tiny call charges to the bandwidth instead. The tiny call prices the
// small payloads (PowerSGD's factors, sizes, DGC's pairs at scale) that a line through two large calls overprices.
LinkCost measure(Communicator& comm, std::size_t large, const Probe& run) {
  if (comm.size() <= 1) return {};
  const std::size_t small = std::max<std::size_t>(large / 4, 1);
  run(large);  // warm-up: connections, buffers
  const double t_tiny = typical(comm, [&] { run(0); }, 3);
  const double t_small = typical(comm, [&] { run(small); }, 3);
  const double t_large = typical(comm, [&] { run(large); }, 3);
  const double bytes_per_s = static_cast<double>(large - small) / std::max(t_large - t_small, 1e-9);
  return {t_tiny, bytes_per_s, static_cast<double>(small), std::max(t_small, t_tiny)};
}

// The large probe of a collective that cuts each rank's bytes into `ranks` pieces (a ring allreduce, an alltoallv):
// pieces of at least 256 KiB, so that the rate is that of large messages (SMPI's and real networks' rates per message
// grow up to tens of KiB), within [probe_bytes, 16 * probe_bytes].
std::size_t cut_probe(std::size_t probe_bytes, std::size_t ranks) {
  return std::clamp<std::size_t>(ranks * (256 << 10), probe_bytes, 16 * probe_bytes);
}

// run(0) is the tiny call of each probe: a few bytes per rank.
LinkCost measure_allreduce(Communicator& comm, std::size_t probe_bytes) {
  std::vector<float> v(std::max<std::size_t>(cut_probe(probe_bytes, comm.size()) / sizeof(float), 1), 1.0f);
  return measure(comm, v.size() * sizeof(float), [&](std::size_t bytes) {
    comm.allreduce(TensorView(v.data(), std::max<std::size_t>(bytes / sizeof(float), 2), DType::kF32), ReduceOp::kSum);
  });
}

LinkCost measure_broadcast(Communicator& comm, std::size_t probe_bytes) {
  std::vector<std::byte> v(probe_bytes);
  return measure(comm, probe_bytes,
                 [&](std::size_t bytes) { comm.broadcast(std::span(v.data(), std::max<std::size_t>(bytes, 8)), 0); });
}

// Each rank contributes `bytes`; the probe's contribution shrinks with the rank count so that what every rank
// receives stays within 16 probes (64 MiB by default) however large the world.
LinkCost measure_allgatherv(Communicator& comm, std::size_t probe_bytes) {
  const std::size_t n = comm.size();
  const std::size_t each = std::clamp<std::size_t>(probe_bytes * 16 / std::max<std::size_t>(n, 1), 64 << 10,
                                                   std::max<std::size_t>(probe_bytes, 64 << 10));
  std::vector<std::byte> in(each), out(each * n);
  std::vector<std::size_t> counts(n);
  return measure(comm, each, [&](std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 8);
    std::fill(counts.begin(), counts.end(), bytes);
    comm.allgatherv(std::span<const std::byte>(in.data(), bytes), counts, std::span(out.data(), bytes * n));
  });
}

// Each rank sends `bytes` in all, an equal share to every rank (itself included).
LinkCost measure_alltoallv(Communicator& comm, std::size_t probe_bytes) {
  const std::size_t n = comm.size();
  const std::size_t per_peer = std::max<std::size_t>(cut_probe(probe_bytes, n) / std::max<std::size_t>(n, 1), 64);
  std::vector<std::byte> send(per_peer * n), recv(per_peer * n);
  std::vector<std::size_t> counts(n);
  return measure(comm, per_peer * n, [&](std::size_t bytes) {
    const std::size_t each = std::max<std::size_t>(bytes / n, 8);
    std::fill(counts.begin(), counts.end(), each);
    comm.alltoallv(std::span<const std::byte>(send.data(), each * n), counts, std::span(recv.data(), each * n),
                   counts);
  });
}

void measure_exchanges(Communicator& comm, LevelCosts& level, std::size_t probe_bytes) {
  level.allreduce = measure_allreduce(comm, probe_bytes);
  level.allgatherv = measure_allgatherv(comm, probe_bytes);
  level.alltoallv = measure_alltoallv(comm, probe_bytes);
}

// The ordered f32 sum (of the sparse dense switch and of each round) and sra's exchange: an alltoallv of `bytes`, an
// allgatherv of bytes / ranks.
double scatter_gather_time(const LevelCosts& level, int ranks, double bytes) {
  return level.alltoallv.time(bytes) + level.allgatherv.time(bytes / ranks);
}

// Bytes the node leader broadcasts after the leaders' exchange: the leaders' payloads when their sum is decoded from
// them (allgather, sparse below its switch), else the f32 tensor (compressed_allreduce.cc, broadcast_node_result).
double node_broadcast_bytes(int nodes, const CostedCall& call) {
  const double payload = static_cast<double>(call.payload_bytes);
  const double dense = 4.0 * static_cast<double>(call.numel);
  const bool sparse_below_switch =
      call.exchange == PayloadExchange::kSparse && !(nodes * payload > call.sparse_switch_density * 2.0 * dense);
  const bool gathered = call.exchange == PayloadExchange::kAllgather || sparse_below_switch;
  return gathered ? nodes * payload : dense;
}

}  // namespace

double exchange_time(const LevelCosts& level, int ranks, const CostedCall& call) {
  if (ranks <= 1) return 0;
  const double payload = static_cast<double>(call.payload_bytes);
  const double dense = 4.0 * static_cast<double>(call.numel);
  const double sizes = level.allgatherv.time(8);  // the payload sizes' allgather
  switch (call.exchange) {
    case PayloadExchange::kAllreduce: return level.allreduce.time(payload);
    case PayloadExchange::kRounds: return 2 * scatter_gather_time(level, ranks, payload / 2);
    case PayloadExchange::kAllgather: return sizes + level.allgatherv.time(payload);
    case PayloadExchange::kSparse:
      if (ranks * payload > call.sparse_switch_density * 2.0 * dense) {
        return sizes + scatter_gather_time(level, ranks, dense);
      }
      return sizes + level.allgatherv.time(payload);
    case PayloadExchange::kScatterReduceAllgather:
      // the chunks' sizes (one u64 to each rank), then the chunks' exchange and the reduced chunks' sizes
      return level.alltoallv.time(8.0 * ranks) + scatter_gather_time(level, ranks, payload) + sizes;
  }
  return 0;
}

HierarchyChoice choose_hierarchy(const LinkModel& links, const HierarchyShape& shape, const CostedCall& call) {
  HierarchyChoice choice;
  choice.flat_s = exchange_time(links.world, shape.world, call);
  const double dense_bytes = 4.0 * static_cast<double>(call.numel);
  const double node = shape.per_node > 1 ? links.node.allreduce.time(dense_bytes) +
                                               links.node.broadcast.time(node_broadcast_bytes(shape.nodes, call))
                                         : 0;
  choice.hierarchical_s = node + exchange_time(links.leaders, shape.nodes, call);
  choice.hierarchical =
      links.measured && shape.nodes > 1 && shape.per_node > 1 && choice.hierarchical_s < choice.flat_s;
  return choice;
}

void learn_links(Communicator& world, NodeGroups& groups, std::size_t probe_bytes) {
  GRADCOMP_CHECK(groups.node != nullptr, "learn_links: NodeGroups without a node communicator (rank {})", world.rank());
  LinkModel& m = groups.links;
  m.node.allreduce = measure_allreduce(*groups.node, probe_bytes);
  m.node.broadcast = measure_broadcast(*groups.node, probe_bytes);
  world.barrier();  // one level at a time: the probes must not share links
  if (groups.leaders != nullptr) measure_exchanges(*groups.leaders, m.leaders, probe_bytes);
  world.barrier();
  measure_exchanges(world, m.world, probe_bytes);
  // The same model on every rank: each latency and each seconds-per-byte is the maximum over ranks (the slowest node;
  // the leaders' figures reach the other ranks).
  std::vector<LinkCost*> costs;
  for (LevelCosts* level : {&m.node, &m.leaders, &m.world}) {
    for (LinkCost* cost : {&level->allreduce, &level->allgatherv, &level->alltoallv, &level->broadcast}) {
      costs.push_back(cost);
    }
  }
  constexpr std::size_t kFields = 4;
  std::vector<float> shared(kFields * costs.size());
  for (std::size_t i = 0; i < costs.size(); ++i) {
    const LinkCost& c = *costs[i];
    const float seconds_per_byte = c.bytes_per_s > 0 ? static_cast<float>(1.0 / c.bytes_per_s) : 0.0f;
    const float fields[kFields] = {static_cast<float>(c.latency_s), seconds_per_byte, static_cast<float>(c.knee_bytes),
                                   static_cast<float>(c.knee_s)};
    std::copy(fields, fields + kFields, shared.begin() + static_cast<std::ptrdiff_t>(kFields * i));
  }
  world.allreduce(TensorView(shared.data(), shared.size(), DType::kF32), ReduceOp::kMax);
  for (std::size_t i = 0; i < costs.size(); ++i) {
    const float* f = shared.data() + kFields * i;
    *costs[i] = {f[0], f[1] > 0 ? 1.0 / f[1] : 0, f[2], f[3]};
  }
  std::int32_t per_node = groups.node->size();
  world.allreduce(TensorView(&per_node, 1, DType::kI32), ReduceOp::kMax);
  groups.per_node = per_node;
  m.measured = true;
}

}  // namespace gradcomp
