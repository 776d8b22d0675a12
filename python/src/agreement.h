// Cross-rank agreement on an exchange of the torch bridge (the DDP hook, the optimizer's torch backend), checked once
// per layout by the exchange worker before the exchange's first collective. It covers what
// compressed_allreduce's own per-call check (AllreduceOptions::verify) does not: the segment list of a fused bucket,
// and exchanges of Python codecs, which never enter compressed_allreduce.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gradcomp/communicator.h"

namespace gradcomp::python {

// What one rank is about to exchange. `description` is human-readable and complete (name, codec kind, spec, dtype,
// numel, op, hierarchical, segments); `fingerprint` a 16-byte digest of it (computed by the caller, blake2b in
// gradcomp.torch.exchange), identical on ranks that agree. `scope`: who caches the agreement (a hook state or an
// optimizer, through its compressor): a layout agreed in one scope is checked again in another.
struct ExchangeLayout {
  std::uint64_t scope = 0;
  std::array<std::byte, 16> fingerprint{};
  std::string description;
};

// Collective over `comm`: allgathers the 16-byte fingerprints; when they all match, returns. Otherwise every rank
// (all saw the same fingerprints) exchanges the descriptions and throws InvalidArgument naming rank 0's and the first
// differing rank's, with this rank in the message. A rank that does not take part makes the others throw the
// communicator's Timeout/CommError.
void check_agreement(Communicator& comm, const ExchangeLayout& layout);

}  // namespace gradcomp::python
