// Cross-rank agreement (gradcomp/collectives.h, verify.h): a 16-byte fingerprint of each rank's description is
// allgathered; on a mismatch the full descriptions are exchanged so that every rank can name both sides.
#include "comm/algorithms/verify.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "comm/algorithms/algorithms.h"
#include "comm/blobs.h"
#include "gradcomp/error.h"
#include "kernels/philox_ops.cuh"

namespace gradcomp {

std::array<std::byte, 16> agreement_fingerprint(std::string_view description) {
  const std::uint64_t words[2] = {kernels::fnv1a64(description.data(), description.size()), description.size()};
  std::array<std::byte, 16> fingerprint;
  std::memcpy(fingerprint.data(), words, sizeof(words));
  return fingerprint;
}

void check_agreement(Communicator& comm, std::string_view what, std::string_view description) {
  const auto n = static_cast<std::size_t>(comm.size());
  if (n == 1) return;
  const std::array<std::byte, 16> mine = agreement_fingerprint(description);
  std::vector<std::array<std::byte, 16>> all(n);
  comm.allgather(mine, std::as_writable_bytes(std::span(all)));
  std::size_t first_bad = 0;
  for (std::size_t r = 1; r < n && first_bad == 0; ++r) {
    if (all[r] != all[0]) first_bad = r;
  }
  if (first_bad == 0) return;

  // Every rank saw the same fingerprints, so every rank takes this path: exchange the descriptions.
  std::vector<std::string> descriptions;
  for (const auto& blob : comm::allgather_blobs(comm, std::as_bytes(std::span(description)))) {
    descriptions.emplace_back(reinterpret_cast<const char*>(blob.data()), blob.size());
  }
  throw InvalidArgument(fmt::format("{}: ranks disagree (seen on rank {} of {}): rank 0 has {}, but rank {} has {}",
                                    what, comm.rank(), n, descriptions[0], first_bad, descriptions[first_bad]));
}

namespace algorithms {

std::string describe_allreduce(const Compressor& compressor, const TensorView& tensor, std::string_view name,
                               const AllreduceOptions& options) {
  std::string description =
      fmt::format("name='{}' numel={} dtype={} spec='{}' algorithm={} op={}{}", name, tensor.numel(),
                  dtype_name(tensor.dtype()), compressor.spec(), algorithm_name(options.algorithm),
                  reduce_op_name(options.op), options.hierarchical ? " hierarchical" : "");
  const bool rows = compressor.traits().rounds;  // shape-aware codecs size their rounds by the matrices' rows
  if (options.segments.empty() && rows) description += fmt::format(" rows={}", tensor.rows());
  if (!options.segments.empty()) description += " segments=[";
  for (std::size_t s = 0; s < options.segments.size(); ++s) {
    const TensorSegment& segment = options.segments[s];
    description += fmt::format("{}{}:{}", s == 0 ? "" : ", ", segment.name, segment.numel);
    if (rows) description += fmt::format("/{}rows", segment.rows);
  }
  if (!options.segments.empty()) description += "]";
  return description;
}

void verify_agreement(Communicator& comm, const Compressor& compressor, const TensorView& tensor, std::string_view name,
                      const AllreduceOptions& options) {
  check_agreement(comm, "compressed_allreduce", describe_allreduce(compressor, tensor, name, options));
}

}  // namespace algorithms
}  // namespace gradcomp
