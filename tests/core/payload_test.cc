#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "compressors/framework/payload.h"
#include "gradcomp/error.h"

namespace gradcomp::payload {
namespace {

std::vector<std::byte> make_payload(Header header) {
  std::vector<std::byte> bytes(total_bytes(header), std::byte{0x5a});
  write_header(header, bytes);
  return bytes;
}

Header two_sections() {
  Header header;
  header.codec = CodecId::kTopK;
  header.numel = 1000;
  header.param0 = 7;
  header.section_count = 2;
  header.section_bytes = {40, 40, 0, 0};
  return header;
}

TEST(Payload, LayoutAlignsSections) {
  const Header header = two_sections();
  EXPECT_EQ(section_offset(header, 0), kHeaderBytes);
  EXPECT_EQ(section_offset(header, 1), kHeaderBytes + 48);
  EXPECT_EQ(total_bytes(header), kHeaderBytes + 48 + 40);
}

TEST(Payload, ParseRoundTrip) {
  const auto bytes = make_payload(two_sections());
  const View view = parse(bytes, CodecId::kTopK, 1000);
  EXPECT_EQ(view.header.numel, 1000u);
  EXPECT_EQ(view.header.param0, 7u);
  EXPECT_EQ(view.sections[1].size(), 40u);
  EXPECT_EQ(view.sections[1].data(), bytes.data() + kHeaderBytes + 48);
}

TEST(Payload, RejectsEveryTruncationAndExtension) {
  auto bytes = make_payload(two_sections());
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_THROW(parse(std::span(bytes).first(length), CodecId::kTopK), CorruptPayload) << length;
  }
  bytes.push_back(std::byte{0});
  EXPECT_THROW(parse(bytes, CodecId::kTopK), CorruptPayload);
}

TEST(Payload, RejectsWrongCodecMagicVersionAndNumel) {
  auto bytes = make_payload(two_sections());
  EXPECT_THROW(parse(bytes, CodecId::kQsgd), CorruptPayload);
  EXPECT_THROW(parse(bytes, CodecId::kTopK, 999), CorruptPayload);
  auto bad_magic = bytes;
  bad_magic[0] = std::byte{'X'};
  EXPECT_THROW(parse(bad_magic, CodecId::kTopK), CorruptPayload);
  auto bad_version = bytes;
  bad_version[4] = std::byte{9};
  EXPECT_THROW(parse(bad_version, CodecId::kTopK), CorruptPayload);
}

TEST(Payload, RejectsHostileSectionSizes) {
  auto bytes = make_payload(two_sections());
  const std::uint64_t huge = ~std::uint64_t{0} - 8;
  std::memcpy(bytes.data() + 32, &huge, sizeof(huge));
  EXPECT_THROW(parse(bytes, CodecId::kTopK), CorruptPayload);
  auto too_many = make_payload(two_sections());
  too_many[17] = std::byte{9};
  EXPECT_THROW(parse(too_many, CodecId::kTopK), CorruptPayload);
}

TEST(Payload, EveryByteFlipIsCaughtOrHarmless) {
  const auto bytes = make_payload(two_sections());
  for (std::size_t i = 0; i < kHeaderBytes; ++i) {
    auto flipped = bytes;
    flipped[i] ^= std::byte{0xff};
    try {
      const View view = parse(flipped, CodecId::kTopK);
      // Accepted: then every section must still lie inside the buffer.
      for (std::size_t s = 0; s < view.header.section_count; ++s) {
        EXPECT_GE(view.sections[s].data(), flipped.data());
        EXPECT_LE(view.sections[s].data() + view.sections[s].size(), flipped.data() + flipped.size());
      }
    } catch (const CorruptPayload&) {
    }
  }
}

TEST(Payload, WriteHeaderChecksBufferSize) {
  std::vector<std::byte> small(10);
  EXPECT_THROW(write_header(two_sections(), small), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp::payload
