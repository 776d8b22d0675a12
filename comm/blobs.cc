#include "comm/blobs.h"

#include <cstdint>

namespace gradcomp::comm {

std::vector<std::vector<std::byte>> allgather_blobs(Communicator& comm, std::span<const std::byte> mine) {
  const std::uint64_t my_size = mine.size();
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(comm.size()));
  comm.allgather(std::as_bytes(std::span<const std::uint64_t>(&my_size, 1)),
                 std::as_writable_bytes(std::span<std::uint64_t>(sizes)));
  const std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::size_t total = 0;
  for (const std::size_t count : counts) total += count;
  std::vector<std::byte> all(total);
  comm.allgatherv(mine, counts, all);
  std::vector<std::vector<std::byte>> blobs;
  std::size_t offset = 0;
  for (const std::size_t count : counts) {
    blobs.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(offset),
                       all.begin() + static_cast<std::ptrdiff_t>(offset + count));
    offset += count;
  }
  return blobs;
}

}  // namespace gradcomp::comm
