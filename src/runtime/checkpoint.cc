// Runtime::save_state / load_state: this rank's compression state in the one state envelope
// (include/gradcomp/state_envelope.h, kind "runtime"); states of the runtime's own version 2 still load.
#include <fmt/format.h>

#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"
#include "gradcomp/state_envelope.h"
#include "src/runtime/runtime_impl.h"

namespace gradcomp {
namespace {

constexpr std::uint32_t kLegacyVersion = 2;  // the runtime's own envelope before the shared one

// The executor's bytes and the (world, rank) of a version-2 runtime state: magic | version | checksum | array of
// (u32 world | u32 rank | executor state).
StateEnvelope open_legacy(std::span<const std::byte> state, int rank) {
  ByteReader outer(state, fmt::format("runtime state on rank {}", rank));
  outer.get<std::uint32_t>();
  outer.get<std::uint32_t>();
  const auto sum = outer.get<std::uint64_t>();
  const std::vector<std::byte> bytes = outer.get_array<std::byte>();
  GRADCOMP_CHECK_AS(CorruptPayload, outer.at_end() && state_checksum(bytes) == sum,
                    "Runtime::load_state on rank {}: corrupt state (checksum mismatch or trailing bytes)", rank);
  ByteReader reader(bytes, fmt::format("runtime state on rank {}", rank));
  StateEnvelope envelope;
  envelope.kind = "runtime";
  envelope.world_size = reader.get<std::uint32_t>();
  envelope.rank = reader.get<std::uint32_t>();
  envelope.state.assign(bytes.begin() + 8, bytes.end());
  return envelope;
}

}  // namespace

std::vector<std::byte> Runtime::Impl::save_state() const {
  std::lock_guard lock(mutex_);
  require_idle("Runtime::save_state");
  ByteWriter body;
  executor_.save_state(body);
  StateEnvelope envelope;
  envelope.kind = "runtime";
  envelope.rank = comm_.rank();
  envelope.world_size = comm_.size();
  envelope.state = body.take();
  return seal_state(envelope);
}

void Runtime::Impl::load_state(std::span<const std::byte> state) {
  const std::string where = fmt::format("Runtime::load_state on rank {}", comm_.rank());
  const StateEnvelope envelope = state_envelope_version(state) == kLegacyVersion
                                     ? open_legacy(state, comm_.rank())
                                     : open_state(state, where);
  GRADCOMP_CHECK(envelope.kind == "runtime", "{}: this is the state of a {}, not of a runtime", where, envelope.kind);
  GRADCOMP_CHECK(envelope.world_size == comm_.size() && envelope.rank == comm_.rank(),
                 "Runtime::load_state on rank {} of {}: the state was saved by rank {} of {} (states are per rank)",
                 comm_.rank(), comm_.size(), envelope.rank.value_or(-1), envelope.world_size.value_or(-1));
  ByteReader reader(envelope.state, fmt::format("runtime state on rank {}", comm_.rank()));
  std::lock_guard lock(mutex_);
  require_idle("Runtime::load_state");
  auto shapes = executor_.load_state(reader);
  GRADCOMP_CHECK_AS(CorruptPayload, reader.at_end(), "Runtime::load_state on rank {}: {} trailing bytes",
                    comm_.rank(), reader.remaining());
  loaded_ = std::move(shapes);
}

}  // namespace gradcomp
