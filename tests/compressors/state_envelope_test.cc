// The one state envelope (include/gradcomp/state_envelope.h): a bit-identical round trip, and every kind of damage
// refused with CorruptPayload naming the reader and what is wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/state_envelope.h"

namespace gradcomp {
namespace {

StateEnvelope sample() {
  StateEnvelope e;
  e.kind = "compressor";
  e.spec = "topk:ratio=0.1";
  e.rank = 1;
  e.world_size = 4;
  e.state = {std::byte{1}, std::byte{2}, std::byte{3}};
  return e;
}

std::string refusal(const std::vector<std::byte>& bytes) {
  try {
    open_state(bytes, "my reader");
  } catch (const CorruptPayload& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(StateEnvelope, RoundTripIsBitIdentical) {
  const std::vector<std::byte> sealed = seal_state(sample());
  const StateEnvelope opened = open_state(sealed, "test");
  EXPECT_EQ(opened.kind, "compressor");
  EXPECT_EQ(opened.spec, "topk:ratio=0.1");
  EXPECT_EQ(opened.rank, 1);
  EXPECT_EQ(opened.world_size, 4);
  EXPECT_FALSE(opened.step.has_value());
  EXPECT_EQ(opened.state, sample().state);
  EXPECT_EQ(seal_state(opened), sealed);
  EXPECT_EQ(state_envelope_version(sealed), kStateEnvelopeVersion);
}

TEST(StateEnvelope, DamageIsRefusedNamingTheReader) {
  const std::vector<std::byte> sealed = seal_state(sample());
  for (std::size_t at = 16; at < sealed.size(); ++at) {
    std::vector<std::byte> flipped = sealed;
    flipped[at] ^= std::byte{0x10};
    EXPECT_NE(refusal(flipped).find("checksum mismatch"), std::string::npos) << "byte " << at;
  }
  const std::vector<std::byte> truncated(sealed.begin(), sealed.end() - 1);
  EXPECT_NE(refusal(truncated).find("my reader: corrupt state"), std::string::npos);
  std::vector<std::byte> longer = sealed;
  longer.push_back(std::byte{0});
  EXPECT_NE(refusal(longer).find("corrupt state"), std::string::npos);
  std::vector<std::byte> version = sealed;
  version[4] = std::byte{9};
  EXPECT_NE(refusal(version).find("state format version 9, this build reads 3"), std::string::npos);
  std::vector<std::byte> magic = sealed;
  magic[0] = std::byte{'X'};
  EXPECT_NE(refusal(magic).find("not a gradcomp state"), std::string::npos);
  EXPECT_NE(refusal({}).find("not a gradcomp state"), std::string::npos);
  EXPECT_NE(refusal(std::vector<std::byte>(sealed.begin(), sealed.begin() + 12)).find("truncated header"),
            std::string::npos);
}

TEST(StateEnvelope, ChecksumIsFnv1a64) {
  EXPECT_EQ(state_checksum({}), 0xcbf29ce484222325ull);
  const std::string foobar = "foobar";
  EXPECT_EQ(state_checksum(std::as_bytes(std::span<const char>(foobar))), 0x85944171f73967e8ull);
}

}  // namespace
}  // namespace gradcomp
