#include "agreement.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "gradcomp/error.h"

namespace gradcomp::python {
namespace {

// Every rank's description: an allgather of the sizes, then an allgatherv of the bytes.
std::vector<std::string> gather_descriptions(Communicator& comm, const std::string& mine) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::uint64_t my_size = mine.size();
  std::vector<std::uint64_t> sizes(n);
  comm.allgather(std::as_bytes(std::span(&my_size, 1)), std::as_writable_bytes(std::span(sizes)));
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::vector<std::byte> all(total);
  comm.allgatherv(std::as_bytes(std::span(mine)), counts, all);
  std::vector<std::string> out;
  std::size_t offset = 0;
  for (std::size_t c : counts) {
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + offset, c);
    offset += c;
  }
  return out;
}

}  // namespace

void check_agreement(Communicator& comm, const ExchangeLayout& layout) {
  const auto n = static_cast<std::size_t>(comm.size());
  if (n == 1) return;
  std::vector<std::byte> fingerprints(n * layout.fingerprint.size());
  comm.allgather(layout.fingerprint, fingerprints);
  const std::size_t width = layout.fingerprint.size();
  std::size_t first_bad = 0;
  for (std::size_t r = 1; r < n && first_bad == 0; ++r) {
    if (std::memcmp(fingerprints.data() + r * width, fingerprints.data(), width) != 0) first_bad = r;
  }
  if (first_bad == 0) return;
  const std::vector<std::string> descriptions = gather_descriptions(comm, layout.description);
  throw InvalidArgument(fmt::format(
      "gradcomp: ranks disagree on an exchange (seen on rank {} of {}): rank 0 has {}, but rank {} has {}",
      comm.rank(), n, descriptions[0], first_bad, descriptions[first_bad]));
}

}  // namespace gradcomp::python
