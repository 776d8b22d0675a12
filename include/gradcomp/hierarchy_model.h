// The cost model behind the hierarchical `auto` mode: what the collectives that the algorithms run cost on each level
// (inside a node, between node leaders, over the whole world), learned by timing them on the communicators
// themselves, and the choice between a flat and a hierarchical compressed allreduce that follows.
#pragma once

#include <cstddef>

namespace gradcomp {

// One collective on one communicator, as a function of the `bytes` per rank: through three measured points, a tiny
// call (latency_s), a large call (knee_bytes, knee_s) and the marginal rate past it (bytes_per_s); linear between
// the tiny call and the knee, and on past the knee at bytes_per_s. Fitted to the collective as the communicator runs
// it (MPI picks its own algorithm per size and rank count; ranks of a node share its NIC), not to a link. With
// knee_bytes 0, the line latency_s + bytes / bytes_per_s.
struct LinkCost {
  double latency_s = 0;
  double bytes_per_s = 0;  // 0: free (a level of one rank, or not measured there)
  double knee_bytes = 0;
  double knee_s = 0;
  double time(double bytes) const {
    if (bytes_per_s <= 0) return latency_s;
    if (bytes < knee_bytes) return latency_s + (knee_s - latency_s) * bytes / knee_bytes;
    return (knee_bytes > 0 ? knee_s : latency_s) + (bytes - knee_bytes) / bytes_per_s;
  }
};

// The collectives of one level, each priced by what one rank holds or sends.
struct LevelCosts {
  LinkCost allreduce;   // bytes: the buffer each rank reduces (dense)
  LinkCost allgatherv;  // bytes: each rank's contribution (allgather, sparse, sra's second half)
  LinkCost alltoallv;   // bytes: all a rank sends, 1/size to each rank (sra's first half, ordered f32 sums)
  LinkCost broadcast;   // bytes: the buffer (the hierarchy's last step inside a node)
};

// What the auto mode learned of a world split into nodes. Identical on every rank (measured once, then shared), so
// every rank takes the same decision.
struct LinkModel {
  LevelCosts node;     // inside the slowest node: allreduce and broadcast
  LevelCosts leaders;  // between the node leaders: allreduce, allgatherv, alltoallv
  LevelCosts world;    // over every rank: allreduce, allgatherv, alltoallv
  bool measured = false;
};

// The shape of the world the decision is for.
struct HierarchyShape {
  int world = 1;     // ranks in all
  int nodes = 1;     // node count
  int per_node = 1;  // ranks of the largest node
};

// How a call's algorithm (resolve_algorithm) moves its payloads between the ranks of one level.
enum class PayloadExchange {
  kAllreduce,               // dense: one allreduce of the payload
  kRounds,                  // rounds (PowerSGD): two ordered f32 sums (alltoallv+allgatherv), half the payload each
  kAllgather,               // allgather: the sizes, then an allgatherv of the payloads
  kSparse,                  // sparse: as allgather, or past the dense switch an ordered f32 sum (alltoallv+allgatherv)
  kScatterReduceAllgather,  // sra: alltoallv of the payload's chunks, allgatherv of one reduced chunk per rank
};

// One compressed allreduce to price: `numel` f32 elements whose compressed payload is `payload_bytes` per rank.
struct CostedCall {
  PayloadExchange exchange = PayloadExchange::kAllreduce;
  std::size_t numel = 0;
  std::size_t payload_bytes = 0;
  double sparse_switch_density = 1.0;  // AllreduceOptions::sparse_switch_density (kSparse only)
};

// Predicted seconds of `call`'s flat algorithm over a level of `ranks` ranks with costs `level`.
double exchange_time(const LevelCosts& level, int ranks, const CostedCall& call);

// Predicted seconds of both modes, and the mode to take (hierarchical only when predicted faster):
//   flat:          the call's exchange over the world (exchange_time on links.world);
//   hierarchical:  an allreduce of the f32 tensor inside the node, the call's exchange between the leaders (on
//                  links.leaders, nodes ranks) and a broadcast inside the node: of the leaders' payloads for an
//                  allgather (or sparse below its switch), whose sum every rank decodes, else of the f32 tensor.
struct HierarchyChoice {
  double flat_s = 0;
  double hierarchical_s = 0;
  bool hierarchical = false;
};
HierarchyChoice choose_hierarchy(const LinkModel& links, const HierarchyShape& shape, const CostedCall& call);

}  // namespace gradcomp
