// comm/mpi: an allgatherv whose gathered bytes pass what one MPI call may carry (MPI counts and displacements are
// ints: 64 ranks' top-k payloads of a 1.3B-value model are 6.7 GB), as rounds of smaller allgatherv calls. Private to
// comm/mpi.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

namespace gradcomp::mpi {

// One round: every rank contributes `count` bytes from `send`; MPI gathers counts[r] bytes of rank r at displs[r] of
// `into` (what MPI_Iallgatherv does, waited for).
using GatherRound =
    std::function<void(const std::byte* send, int count, const std::vector<int>& counts,
                       const std::vector<int>& displs, std::byte* into)>;

// Gathers rank r's recv_counts[r] bytes (this rank's are `send`) into `recv` in rank order, in rounds that gather at
// most `max_bytes` in all (each rank's next max_bytes / size bytes per round) through `round`, each round landing in
// `scratch` and copied into place. The caller has checked the counts (size, sum, this rank's); `send` may lie in
// `recv` only at this rank's own place.
void allgatherv_in_rounds(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                          std::span<std::byte> recv, int rank, std::size_t max_bytes, std::vector<std::byte>& scratch,
                          const GatherRound& round);

}  // namespace gradcomp::mpi
