// Cross-rank agreement before a compressed collective: a fixed-size fingerprint of what each rank is about to do is
// allgathered; on a mismatch the full descriptions are exchanged so that every rank can name both sides.
#include <cstring>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "comm/algorithms/algorithms.h"
#include "comm/blobs.h"
#include "gradcomp/error.h"
#include "kernels/philox_ops.cuh"

namespace gradcomp::algorithms {
namespace {

struct Fingerprint {
  std::uint64_t hash = 0;
  std::uint64_t numel = 0;
  std::uint32_t dtype = 0;
  std::uint32_t flags = 0;
  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};
static_assert(sizeof(Fingerprint) == 24);

}  // namespace

void verify_agreement(Communicator& comm, const Compressor& compressor, const TensorView& tensor, std::string_view name,
                      const AllreduceOptions& options) {
  std::string description =
      fmt::format("name='{}' numel={} dtype={} spec='{}' algorithm={} op={}{}", name, tensor.numel(),
                  dtype_name(tensor.dtype()), compressor.spec(), algorithm_name(options.algorithm),
                  reduce_op_name(options.op), options.hierarchical ? " hierarchical" : "");
  if (compressor.traits().rounds) {
    // Shape-aware codecs size their rounds by the matrices' rows: ranks must agree on them too.
    if (options.segments.empty()) description += fmt::format(" rows={}", tensor.rows());
    for (const TensorSegment& segment : options.segments) {
      description += fmt::format(" {}:{}x{}", segment.name, segment.rows, segment.numel);
    }
  }
  Fingerprint mine;
  mine.hash = kernels::fnv1a64(description.data(), description.size());
  mine.numel = tensor.numel();
  mine.dtype = static_cast<std::uint32_t>(tensor.dtype());
  mine.flags = static_cast<std::uint32_t>(options.algorithm) | (static_cast<std::uint32_t>(options.op) << 8) |
               (options.hierarchical ? 1u << 16 : 0u);
  const int n = comm.size();
  std::vector<Fingerprint> all(static_cast<std::size_t>(n));
  comm.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
  int first_bad = -1;
  for (int r = 1; r < n && first_bad < 0; ++r) {
    if (!(all[r] == all[0])) first_bad = r;
  }
  if (first_bad < 0) return;

  // Every rank saw the same fingerprints, so every rank takes this path: exchange the descriptions.
  std::vector<std::string> descriptions;
  for (const auto& blob : comm::allgather_blobs(comm, std::as_bytes(std::span(description)))) {
    descriptions.emplace_back(reinterpret_cast<const char*>(blob.data()), blob.size());
  }
  throw InvalidArgument(fmt::format(
      "compressed_allreduce: ranks disagree on the collective (seen on rank {} of {}): rank 0 has {}, but rank {} "
      "has {}",
      comm.rank(), n, descriptions[0], first_bad, descriptions[first_bad]));
}

}  // namespace gradcomp::algorithms
