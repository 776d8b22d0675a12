// The cost model behind the hierarchical `auto` mode: what one level of links costs, learned by timing the node and
// leader communicators, and the choice between a flat and a hierarchical compressed allreduce that follows from it.
#pragma once

#include <cstddef>

#include "gradcomp/compressor.h"

namespace gradcomp {

// One level of links: moving `bytes` through one step of a collective costs latency_s + bytes / bytes_per_s.
struct LinkCost {
  double latency_s = 0;
  double bytes_per_s = 0;  // 0: unknown (never measured)
  double time(double bytes) const { return latency_s + (bytes_per_s > 0 ? bytes / bytes_per_s : 0); }
};

// The two levels of a world split into nodes: inside a node, and between node leaders. Identical on every rank
// (measured once, then shared), so every rank takes the same decision.
struct LinkModel {
  LinkCost intra;
  LinkCost inter;
  bool measured = false;
};

// The shape of the world the decision is for.
struct HierarchyShape {
  int world = 1;     // ranks in all
  int nodes = 1;     // node count
  int per_node = 1;  // ranks of the largest node
};

// Predicted seconds of both modes for one compressed allreduce of `numel` f32 elements whose compressed payload is
// `payload_bytes` per rank, and the mode to take (hierarchical only when it is predicted faster).
//   flat:          the codec's algorithm over all ranks, every step crossing the inter-node links (a ring whose
//                  node boundaries carry each step's bytes): dense/rounds/sra 2(n-1) steps of payload/n, sparse and
//                  allgather n-1 steps of one payload;
//   hierarchical:  a dense f32 ring allreduce inside the node (2(k-1) steps of 4·numel/k over intra links), the
//                  codec's algorithm between the m leaders (as flat with n = m), a broadcast of 4·numel inside the
//                  node.
struct HierarchyChoice {
  double flat_s = 0;
  double hierarchical_s = 0;
  bool hierarchical = false;
};
HierarchyChoice choose_hierarchy(const LinkModel& links, const HierarchyShape& shape, const CompressorTraits& traits,
                                 std::size_t numel, std::size_t payload_bytes);

}  // namespace gradcomp
