// seal_state / open_state: the one state envelope (include/gradcomp/state_envelope.h).
#include "gradcomp/state_envelope.h"

#include <cstring>

#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"
#include "kernels/fnv1a.cuh"

namespace gradcomp {
namespace {

constexpr std::uint32_t kMagic = 0x53524347;  // "GCRS"

void put_optional(ByteWriter& out, const std::optional<std::int64_t>& value) {
  out.put<std::uint8_t>(value.has_value() ? 1 : 0);
  out.put<std::int64_t>(value.value_or(0));
}

std::optional<std::int64_t> get_optional(ByteReader& in, std::string_view where) {
  const auto present = in.get<std::uint8_t>();
  const auto value = in.get<std::int64_t>();
  GRADCOMP_CHECK_AS(CorruptPayload, present <= 1, "{}: corrupt state (bad field flag {})", where, present);
  return present == 1 ? std::optional<std::int64_t>(value) : std::nullopt;
}

}  // namespace

std::uint64_t state_checksum(std::span<const std::byte> bytes) {
  return kernels::fnv1a64(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::vector<std::byte> seal_state(const StateEnvelope& envelope) {
  ByteWriter body;
  body.put_string(envelope.kind);
  body.put_string(envelope.spec);
  put_optional(body, envelope.rank);
  put_optional(body, envelope.world_size);
  put_optional(body, envelope.step);
  body.put_array(std::span<const std::byte>(envelope.state));
  const std::vector<std::byte> bytes = body.take();
  const std::uint32_t head[2] = {kMagic, kStateEnvelopeVersion};
  const std::uint64_t sum = state_checksum(bytes);
  std::vector<std::byte> sealed(16 + bytes.size());
  std::memcpy(sealed.data(), head, 8);
  std::memcpy(sealed.data() + 8, &sum, 8);
  if (!bytes.empty()) std::memcpy(sealed.data() + 16, bytes.data(), bytes.size());
  return sealed;
}

std::optional<std::uint32_t> state_envelope_version(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) return std::nullopt;
  ByteReader in(bytes, "state");
  if (in.get<std::uint32_t>() != kMagic) return std::nullopt;
  return in.get<std::uint32_t>();
}

StateEnvelope open_state(std::span<const std::byte> bytes, std::string_view where) {
  const auto version = state_envelope_version(bytes);
  GRADCOMP_CHECK_AS(CorruptPayload, version.has_value(), "{}: not a gradcomp state (no 'GCRS' envelope)", where);
  GRADCOMP_CHECK_AS(CorruptPayload, *version == kStateEnvelopeVersion,
                    "{}: state format version {}, this build reads {}", where, *version, kStateEnvelopeVersion);
  GRADCOMP_CHECK_AS(CorruptPayload, bytes.size() >= 16, "{}: corrupt state (truncated header)", where);
  ByteReader header(bytes.first(16), where);
  header.get<std::uint64_t>();
  const auto sum = header.get<std::uint64_t>();
  const std::span<const std::byte> body = bytes.subspan(16);
  GRADCOMP_CHECK_AS(CorruptPayload, state_checksum(body) == sum,
                    "{}: corrupt state (checksum mismatch: flipped or truncated bytes)", where);
  ByteReader in(body, where);
  StateEnvelope envelope;
  envelope.kind = in.get_string();
  envelope.spec = in.get_string();
  envelope.rank = get_optional(in, where);
  envelope.world_size = get_optional(in, where);
  envelope.step = get_optional(in, where);
  envelope.state = in.get_array<std::byte>();
  GRADCOMP_CHECK_AS(CorruptPayload, in.at_end(), "{}: corrupt state ({} trailing bytes)", where, in.remaining());
  return envelope;
}

}  // namespace gradcomp
