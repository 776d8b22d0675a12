// Runtime::save_state / load_state: this rank's compression state in a versioned, checksummed envelope.
#include <fmt/format.h>

#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"
#include "kernels/fnv1a.cuh"
#include "src/runtime/runtime_impl.h"

namespace gradcomp {
namespace {

constexpr std::uint32_t kStateMagic = 0x53524347;  // "GCRS"
constexpr std::uint32_t kStateVersion = 2;  // 2: residuals live in the codecs, keyed by tensor name

}  // namespace

// FNV-1a, 64 bit (the one hash of the library): catches damaged states before any field is interpreted.
std::uint64_t state_checksum(std::span<const std::byte> bytes) {
  return kernels::fnv1a64(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::vector<std::byte> Runtime::Impl::save_state() const {
  std::lock_guard lock(mutex_);
  require_idle("Runtime::save_state");
  ByteWriter body;
  body.put<std::uint32_t>(static_cast<std::uint32_t>(comm_.size()));
  body.put<std::uint32_t>(static_cast<std::uint32_t>(comm_.rank()));
  executor_.save_state(body);
  const std::vector<std::byte> bytes = body.take();
  ByteWriter out;
  out.put<std::uint32_t>(kStateMagic);
  out.put<std::uint32_t>(kStateVersion);
  out.put<std::uint64_t>(state_checksum(bytes));
  out.put_array(std::span<const std::byte>(bytes));
  return out.take();
}

void Runtime::Impl::load_state(std::span<const std::byte> state) {
  ByteReader outer(state, fmt::format("runtime state on rank {}", comm_.rank()));
  GRADCOMP_CHECK_AS(CorruptPayload, outer.get<std::uint32_t>() == kStateMagic,
                    "Runtime::load_state on rank {}: not a runtime state (bad magic)", comm_.rank());
  const auto version = outer.get<std::uint32_t>();
  GRADCOMP_CHECK_AS(CorruptPayload, version == kStateVersion,
                    "Runtime::load_state on rank {}: state format version {}, this build reads {}", comm_.rank(),
                    version, kStateVersion);
  const auto sum = outer.get<std::uint64_t>();
  const std::vector<std::byte> bytes = outer.get_array<std::byte>();
  GRADCOMP_CHECK_AS(CorruptPayload, outer.at_end() && state_checksum(bytes) == sum,
                    "Runtime::load_state on rank {}: corrupt state (checksum mismatch or trailing bytes)",
                    comm_.rank());
  ByteReader reader(bytes, fmt::format("runtime state on rank {}", comm_.rank()));
  const auto world = reader.get<std::uint32_t>();
  const auto rank = reader.get<std::uint32_t>();
  GRADCOMP_CHECK(world == static_cast<std::uint32_t>(comm_.size()) &&
                     rank == static_cast<std::uint32_t>(comm_.rank()),
                 "Runtime::load_state on rank {} of {}: the state was saved by rank {} of {} (states are per rank)",
                 comm_.rank(), comm_.size(), rank, world);
  std::lock_guard lock(mutex_);
  require_idle("Runtime::load_state");
  auto shapes = executor_.load_state(reader);
  GRADCOMP_CHECK_AS(CorruptPayload, reader.at_end(), "Runtime::load_state on rank {}: {} trailing bytes",
                    comm_.rank(), reader.remaining());
  loaded_ = std::move(shapes);
}

}  // namespace gradcomp
