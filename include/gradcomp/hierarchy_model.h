// The cost model behind the hierarchical `auto` mode: what the collectives of each level cost (allreduce and
// allgather inside a node, between node leaders and over the whole world), learned by timing them on the
// communicators themselves, and the choice between a flat and a hierarchical compressed allreduce that follows.
#pragma once

#include <cstddef>

namespace gradcomp {

// One collective on one communicator: moving `bytes` (per rank) costs latency_s + bytes / bytes_per_s. Fitted to the
// collective as the communicator runs it (MPI picks its own algorithm per size and rank count), not to a link.
struct LinkCost {
  double latency_s = 0;
  double bytes_per_s = 0;  // 0: free (a level of one rank)
  double time(double bytes) const { return latency_s + (bytes_per_s > 0 ? bytes / bytes_per_s : 0); }
};

// What the auto mode learned of a world split into nodes. Identical on every rank (measured once, then shared), so
// every rank takes the same decision.
struct LinkModel {
  LinkCost node_allreduce;     // an allreduce of `bytes` inside a node (the slowest node)
  LinkCost leader_allreduce;   // an allreduce of `bytes` between the node leaders
  LinkCost leader_allgather;   // an allgather, `bytes` from each leader
  LinkCost world_allreduce;    // an allreduce of `bytes` over every rank
  LinkCost world_allgather;    // an allgather, `bytes` from each rank
  bool measured = false;
};

// The shape of the world the decision is for.
struct HierarchyShape {
  int world = 1;     // ranks in all
  int nodes = 1;     // node count
  int per_node = 1;  // ranks of the largest node
};

// Predicted seconds of both modes for one compressed allreduce of `numel` f32 elements whose compressed payload is
// `payload_bytes` per rank, and the mode to take (hierarchical only when predicted faster). `gathered`: the call's
// algorithm (resolve_algorithm) gathers the payloads (allgather, sparse) rather than reducing them (dense, sra,
// rounds).
//   flat:          that algorithm over the world: an allgather or an allreduce of the payload;
//   hierarchical:  an allreduce of the f32 tensor inside the node, the codec's algorithm between the leaders (as
//                  flat, on the leaders' costs), and a broadcast of the f32 tensor inside the node (half a node
//                  allreduce of it).
struct HierarchyChoice {
  double flat_s = 0;
  double hierarchical_s = 0;
  bool hierarchical = false;
};
HierarchyChoice choose_hierarchy(const LinkModel& links, const HierarchyShape& shape, bool gathered, std::size_t numel,
                                 std::size_t payload_bytes);

}  // namespace gradcomp
