// comm/mpi: a pipelined ring allreduce of our own, in place, over point-to-point messages. A reduce-scatter then an
// allgather, 2(n-1) steps; each rank's block is cut into segments that travel independently, so a segment is reduced
// and sent on to the next rank while the following segments are still on the wire. It moves what Open MPI's ring
// moves (2(n-1)/n of the array per rank) but needs no second buffer of the array's size (Open MPI's non-blocking
// ring first copies the input into a separate result buffer), and on a link-bound run it keeps the link busy to the
// last segment (measured: docs/performance-peers.md, "The MPI ring").
// Private to comm/mpi.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

#include "comm/mpi/mpi_support.h"

namespace gradcomp::mpi {

// What the ring needs from its communicator. Both hooks get every request still in flight (they read or write
// `data` and `scratch`), to abandon them with the buffers before they throw.
struct RingHooks {
  using InFlight = std::function<std::vector<MPI_Request>()>;
  // A pass over the segments made no progress (`idle_passes` in a row): nap, or throw (Timeout, CommError) once the
  // deadline has passed or another rank has failed.
  std::function<void(unsigned idle_passes, const InFlight& in_flight)> idle;
  // An MPI call returned `rc` != MPI_SUCCESS: throw CommError naming `call`.
  std::function<void(int rc, std::string_view call, const InFlight& in_flight)> fail;
};

// Sums (or reduces with `op`, which must be commutative) `count` elements of `type` (`element_bytes` each) at `data`
// across every rank of `comm`, in place: afterwards every rank holds the same bytes. `scratch` (grown as needed)
// holds two blocks' worth of incoming segments. Every rank must call it with the same count, type and op. Messages
// use tags 1..16384 on `comm`. Returns after every message has completed; throws only through `hooks`.
void ring_allreduce(std::byte* data, std::size_t count, MPI_Datatype type, std::size_t element_bytes, MPI_Op op,
                    MPI_Comm comm, std::vector<std::byte>& scratch, const RingHooks& hooks);

}  // namespace gradcomp::mpi
