#include "comm/mpi/mpi_gather_rounds.h"

#include <algorithm>

#include "comm/mpi/mpi_buffers.h"

namespace gradcomp::mpi {

void allgatherv_in_rounds(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                          std::span<std::byte> recv, int rank, std::size_t max_bytes, std::vector<std::byte>& scratch,
                          const GatherRound& round) {
  const std::size_t size = recv_counts.size();
  const std::size_t quota = std::max<std::size_t>(1, max_bytes / size);
  std::vector<std::size_t> placed(size, 0);  // where rank r's bytes start in recv
  for (std::size_t r = 1; r < size; ++r) placed[r] = placed[r - 1] + recv_counts[r - 1];
  const std::size_t longest = *std::max_element(recv_counts.begin(), recv_counts.end());
  std::vector<int> counts(size), displs(size);
  for (std::size_t at = 0; at < longest; at += quota) {
    std::size_t total = 0;
    for (std::size_t r = 0; r < size; ++r) {
      const std::size_t n = recv_counts[r] > at ? std::min(quota, recv_counts[r] - at) : 0;
      counts[r] = static_cast<int>(n);
      displs[r] = static_cast<int>(total);
      total += n;
    }
    if (scratch.size() < total) scratch.resize(total);
    const auto mine = static_cast<std::size_t>(rank);
    round(send.data() + std::min(at, send.size()), counts[mine], counts, displs, scratch.data());
    for (std::size_t r = 0; r < size; ++r) {
      copy_bytes(recv.data() + placed[r] + at, scratch.data() + displs[r], static_cast<std::size_t>(counts[r]));
    }
  }
}

}  // namespace gradcomp::mpi
