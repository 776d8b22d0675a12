#include "compressors/framework/payload.h"

#include <bit>
#include <cstring>

#include "compressors/framework/codec_table.h"
#include "gradcomp/error.h"

namespace gradcomp::payload {
static_assert(std::endian::native == std::endian::little, "gradcomp payloads assume a little-endian host");

namespace {
template <typename T>
void put(std::span<std::byte> out, std::size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}
template <typename T>
T get(std::span<const std::byte> in, std::size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}
}  // namespace

std::size_t section_offset(const Header& header, std::size_t index) {
  std::size_t offset = kHeaderBytes;
  for (std::size_t i = 0; i < index; ++i) offset += align_up(header.section_bytes[i]);
  return offset;
}

std::size_t total_bytes(const Header& header) {
  std::size_t total = kHeaderBytes;
  for (std::size_t i = 0; i < header.section_count; ++i) {
    total += i + 1 == header.section_count ? header.section_bytes[i] : align_up(header.section_bytes[i]);
  }
  return total;
}

void encode_header(const Header& header, std::span<std::byte, kHeaderBytes> out) {
  std::memset(out.data(), 0, kHeaderBytes);
  put<std::uint32_t>(out, 0, kMagic);
  put<std::uint16_t>(out, 4, kVersion);
  put<std::uint16_t>(out, 6, static_cast<std::uint16_t>(header.codec));
  put<std::uint64_t>(out, 8, header.numel);
  put<std::uint8_t>(out, 16, static_cast<std::uint8_t>(header.dtype));
  put<std::uint8_t>(out, 17, header.section_count);
  put<std::uint16_t>(out, 18, header.flags);
  put<std::uint32_t>(out, 24, header.param0);
  put<std::uint32_t>(out, 28, header.param1);
  for (std::size_t i = 0; i < kMaxSections; ++i) {
    put<std::uint64_t>(out, 32 + 8 * i, i < header.section_count ? header.section_bytes[i] : 0);
  }
}

std::size_t write_header(const Header& header, std::span<std::byte> out) {
  GRADCOMP_ASSERT(header.section_count <= kMaxSections, "section count {} > {}", header.section_count, kMaxSections);
  const std::size_t total = total_bytes(header);
  GRADCOMP_CHECK(out.size() >= total, "payload buffer of {} bytes is too small: {} needed ({} elements, codec {})",
                 out.size(), total, header.numel, codec_name(header.codec));
  encode_header(header, out.first<kHeaderBytes>());
  for (std::size_t i = 0; i + 1 < header.section_count; ++i) {
    const std::size_t end = section_offset(header, i) + header.section_bytes[i];
    std::memset(out.data() + end, 0, align_up(header.section_bytes[i]) - header.section_bytes[i]);
  }
  return total;
}

Header peek_header(std::span<const std::byte> bytes) {
  GRADCOMP_CHECK_AS(CorruptPayload, bytes.size() >= kHeaderBytes,
                    "corrupt payload: {} bytes is shorter than the {}-byte header", bytes.size(), kHeaderBytes);
  return decode_header(bytes.first<kHeaderBytes>(), bytes.size());
}

Header decode_header(std::span<const std::byte, kHeaderBytes> prefix, std::size_t payload_size) {
  // `bytes` spans only the header; sizes are checked against the whole payload's length.
  const std::span<const std::byte> bytes(prefix.data(), prefix.size());
  const auto magic = get<std::uint32_t>(bytes, 0);
  GRADCOMP_CHECK_AS(CorruptPayload, magic == kMagic, "corrupt payload: bad magic {:#010x} (expected {:#010x})", magic,
                    kMagic);
  const auto version = get<std::uint16_t>(bytes, 4);
  GRADCOMP_CHECK_AS(CorruptPayload, version == kVersion, "corrupt payload: unsupported version {} (this build reads {})",
                    version, kVersion);
  Header header;
  header.codec = static_cast<CodecId>(get<std::uint16_t>(bytes, 6));
  header.numel = get<std::uint64_t>(bytes, 8);
  const auto dtype = get<std::uint8_t>(bytes, 16);
  GRADCOMP_CHECK_AS(CorruptPayload, dtype <= static_cast<std::uint8_t>(DType::kU8), "corrupt payload: bad dtype {}",
                    dtype);
  header.dtype = static_cast<DType>(dtype);
  header.section_count = get<std::uint8_t>(bytes, 17);
  GRADCOMP_CHECK_AS(CorruptPayload, header.section_count <= kMaxSections, "corrupt payload: {} sections (max {})",
                    header.section_count, kMaxSections);
  header.flags = get<std::uint16_t>(bytes, 18);
  header.param0 = get<std::uint32_t>(bytes, 24);
  header.param1 = get<std::uint32_t>(bytes, 28);
  std::size_t total = kHeaderBytes;
  for (std::size_t i = 0; i < kMaxSections; ++i) {
    header.section_bytes[i] = get<std::uint64_t>(bytes, 32 + 8 * i);
    if (i >= header.section_count) {
      GRADCOMP_CHECK_AS(CorruptPayload, header.section_bytes[i] == 0, "corrupt payload: unused section {} has size {}",
                        i, header.section_bytes[i]);
      continue;
    }
    // Each section must fit in what is left of the buffer: this also rules out overflow of the running total.
    GRADCOMP_CHECK_AS(CorruptPayload, header.section_bytes[i] <= payload_size,
                      "corrupt payload: section {} claims {} bytes of a {}-byte payload", i, header.section_bytes[i],
                      payload_size);
    total += i + 1 == header.section_count ? header.section_bytes[i] : align_up(header.section_bytes[i]);
  }
  GRADCOMP_CHECK_AS(CorruptPayload, total == payload_size,
                    "corrupt payload: sections add up to {} bytes but the payload has {} (truncated or padded)", total,
                    payload_size);
  return header;
}

View parse(std::span<const std::byte> bytes, CodecId expected, long long expected_numel) {
  View view;
  view.header = peek_header(bytes);
  GRADCOMP_CHECK_AS(CorruptPayload, view.header.codec == expected,
                    "corrupt payload: codec {} ({}) where {} ({}) was expected",
                    codec_name(view.header.codec), static_cast<int>(view.header.codec), codec_name(expected),
                    static_cast<int>(expected));
  if (expected_numel >= 0) {
    GRADCOMP_CHECK_AS(CorruptPayload, view.header.numel == static_cast<std::uint64_t>(expected_numel),
                      "corrupt payload: it holds {} elements but the output tensor has {}", view.header.numel,
                      expected_numel);
  }
  for (std::size_t i = 0; i < view.header.section_count; ++i) {
    view.sections[i] = bytes.subspan(section_offset(view.header, i), view.header.section_bytes[i]);
  }
  return view;
}

std::string_view codec_name(CodecId codec) {
  if (codec == CodecId::kCustom) return "custom";
  const CodecRow* row = codec_row(codec);
  return row ? row->name : "unknown";
}

}  // namespace gradcomp::payload
