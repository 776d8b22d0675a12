// The one envelope of every saved state, C++ and Python alike: the runtime's Runtime::save_state(), a compressor's,
// the DDP hook's and DistributedOptimizer's state_dict() (python/gradcomp/_state.py), the elastic commit files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp {

// What an envelope carries besides the state bytes: who saved it and for which codec.
struct StateEnvelope {
  std::string kind;                        // "runtime", "compressor", "ddp_hook", "optimizer", ...
  std::string spec;                        // the codec spec the state belongs to ("" where none: the runtime)
  std::optional<std::int64_t> rank;        // set where states are per rank
  std::optional<std::int64_t> world_size;  // set with rank
  std::optional<std::int64_t> step;        // set where the owner counts steps
  std::vector<std::byte> state;            // the owner's serialized state
};

// Format version seal_state() writes: 3. Layout, little-endian: u32 magic "GCRS" | u32 version | u64 checksum |
// the checksummed body: u64 length + kind | u64 length + spec | rank, world_size, step each as u8 present + i64 |
// u64 length + state. The checksum is state_checksum() of the body, so any flipped or missing byte is caught before
// a field is read.
inline constexpr std::uint32_t kStateEnvelopeVersion = 3;

// The envelope's bytes.
std::vector<std::byte> seal_state(const StateEnvelope& envelope);

// Parses and checks an envelope of version 3. Throws CorruptPayload, naming `where`, for: another magic (not a
// gradcomp state), another version (naming it and the one this build reads), a checksum mismatch, truncated or
// trailing bytes. Checks nothing about the fields (the caller compares kind, spec, rank).
StateEnvelope open_state(std::span<const std::byte> bytes, std::string_view where);

// The version field of envelope-shaped bytes (their magic checked), for readers of older versions; nullopt when the
// bytes do not start with the magic.
std::optional<std::uint32_t> state_envelope_version(std::span<const std::byte> bytes);

// The checksum of every saved state: FNV-1a, 64 bit, of `bytes` (kernels/fnv1a.cuh, the library's one hash).
std::uint64_t state_checksum(std::span<const std::byte> bytes);

}  // namespace gradcomp
