// Cross-rank agreement on an exchange of the torch bridge (the DDP hook, the optimizer's torch backend), checked once
// per layout by the exchange worker before the exchange's first collective with gradcomp::check_agreement
// (collectives.h), the check compressed_allreduce's AllreduceOptions::verify runs. It covers the segment list of a
// fused bucket and exchanges of Python codecs, which never enter compressed_allreduce.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"

namespace gradcomp::python {

// What one rank is about to exchange. `description` is human-readable and complete (name, codec kind, spec, dtype,
// numel, op, hierarchical, segments; built by gradcomp.torch.exchange); `fingerprint` is
// agreement_fingerprint(description), the key of a passed check. `scope`: who caches the agreement (a hook state or
// an optimizer, through its compressor): a layout agreed in one scope is checked again in another.
struct ExchangeLayout {
  std::uint64_t scope = 0;
  std::array<std::byte, 16> fingerprint{};
  std::string description;
};

// Collective over `comm`: check_agreement(comm, "gradcomp exchange", layout.description) — InvalidArgument on every
// rank naming rank 0's and the first differing rank's description, with this rank in the message.
inline void check_agreement(Communicator& comm, const ExchangeLayout& layout) {
  gradcomp::check_agreement(comm, "gradcomp exchange", layout.description);
}

}  // namespace gradcomp::python
