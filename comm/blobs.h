// Gathering host byte strings of different sizes (negotiation announcements, agreement descriptions).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "gradcomp/communicator.h"

namespace gradcomp::comm {

// Every rank's `mine` (host memory, any size per rank), in rank order: one allgather of the sizes, one allgatherv.
// Collective. For the payloads of the collectives, which may live on a device, see algorithms::allgather_payloads.
std::vector<std::vector<std::byte>> allgather_blobs(Communicator& comm, std::span<const std::byte> mine);

}  // namespace gradcomp::comm
