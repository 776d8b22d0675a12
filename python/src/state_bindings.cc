// Bindings of the one state envelope (include/gradcomp/state_envelope.h), which gradcomp/_state.py seals every Python
// state_dict() with and Runtime.save_state() writes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <span>

#include "bindings.h"
#include "gradcomp/state_envelope.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gradcomp::python {
namespace {

std::span<const std::byte> bytes_of(const nb::bytes& data) {
  return {static_cast<const std::byte*>(data.data()), data.size()};
}

nb::bytes to_bytes(const std::vector<std::byte>& data) {
  return nb::bytes(reinterpret_cast<const char*>(data.data()), data.size());
}

}  // namespace

void init_state(nb::module_& m) {
  m.attr("STATE_ENVELOPE_VERSION") = kStateEnvelopeVersion;
  m.def(
      "seal_state",
      [](std::string kind, std::string spec, nb::bytes state, std::optional<std::int64_t> rank,
         std::optional<std::int64_t> world_size, std::optional<std::int64_t> step) {
        StateEnvelope envelope{std::move(kind), std::move(spec), rank, world_size, step, {}};
        const auto data = bytes_of(state);
        envelope.state.assign(data.begin(), data.end());
        return to_bytes(seal_state(envelope));
      },
      "kind"_a, "spec"_a, "state"_a, "rank"_a = nb::none(), "world_size"_a = nb::none(), "step"_a = nb::none(),
      "The envelope's bytes (format version STATE_ENVELOPE_VERSION, checksummed), as Runtime.save_state() writes.");
  m.def(
      "open_state",
      [](nb::bytes data, std::string_view where) {
        const StateEnvelope envelope = open_state(bytes_of(data), where);
        nb::dict d;
        d["kind"] = envelope.kind;
        d["spec"] = envelope.spec;
        d["rank"] = envelope.rank;
        d["world_size"] = envelope.world_size;
        d["step"] = envelope.step;
        d["state"] = to_bytes(envelope.state);
        return d;
      },
      "data"_a, "where"_a = "open_state",
      "The fields of an envelope (kind, spec, rank, world_size, step, state) after checking it; CorruptPayload "
      "naming `where` for another format or version, a checksum mismatch, truncated or trailing bytes.");
  m.def(
      "state_envelope_version", [](nb::bytes data) { return state_envelope_version(bytes_of(data)); }, "data"_a,
      "The version field of envelope bytes; None when they are not a gradcomp envelope.");
  m.def(
      "state_checksum", [](nb::bytes data) { return state_checksum(bytes_of(data)); }, "data"_a,
      "The checksum of every saved state (FNV-1a, 64 bit), as the envelope computes it.");
}

}  // namespace gradcomp::python
