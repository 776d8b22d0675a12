// Self-describing payload layout shared by every codec (CPU and CUDA write the same bytes):
//
//   offset 0  u32 magic "GCP1" | u16 version | u16 codec id | u64 numel | u8 dtype | u8 section count | u16 flags
//          24 u32 param0 | u32 param1 (codec parameters the decoder must agree with, e.g. QSGD bits and bucket)
//          32 u64 section_bytes[4]
//          64 section 0, each section starting at a multiple of 16 bytes (zero padding between sections)
//
// Little-endian. parse() validates every field and that the sizes add up to exactly the buffer length, so a
// codec's decoder only has to check that each section has the size its parameters imply and that indices are in
// range.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "gradcomp/tensor.h"

namespace gradcomp::payload {

enum class CodecId : std::uint16_t {
  // clang-format off
  kNone = 1, kFp16 = 2, kBf16 = 3,                        // dense
  kQsgd = 4, kTernGrad = 5, kOneBit = 6,                  // quantizers
  kTopK = 7, kRandomK = 8, kBlockTopK = 9, kDgc = 10,     // sparsifiers
  kPowerSgd = 11,                                         // low rank
  kCustom = 100,                                          // a codec registered by a user
  // clang-format on
};

inline constexpr std::uint32_t kMagic = 0x31504347u;  // "GCP1"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kMaxSections = 4;
inline constexpr std::size_t kSectionAlign = 16;

struct Header {
  CodecId codec = CodecId::kNone;
  std::uint64_t numel = 0;
  DType dtype = DType::kF32;  // dtype of the original tensor
  std::uint16_t flags = 0;
  std::uint32_t param0 = 0;
  std::uint32_t param1 = 0;
  std::uint8_t section_count = 0;
  std::array<std::uint64_t, kMaxSections> section_bytes{};
};

constexpr std::size_t align_up(std::size_t bytes) { return (bytes + kSectionAlign - 1) / kSectionAlign * kSectionAlign; }

// Offset of section `index` (sections before it are padded to kSectionAlign).
std::size_t section_offset(const Header& header, std::size_t index);
// Total payload size implied by the header.
std::size_t total_bytes(const Header& header);

// Writes the header (and zeroes the padding after each section) into `out`; returns the total payload size.
// Throws InvalidArgument if `out` is smaller than total_bytes(header).
std::size_t write_header(const Header& header, std::span<std::byte> out);

// A validated payload: the header and views of its sections.
struct View {
  Header header;
  std::array<std::span<const std::byte>, kMaxSections> sections{};
};

// Validates magic, version, codec (== expected), section count/sizes and total length; throws CorruptPayload with a
// message naming what is wrong. When `expected_numel` is non-negative the numel must match it too.
View parse(std::span<const std::byte> bytes, CodecId expected, long long expected_numel = -1);

// Reads only the header fields (validated as in parse, without the codec check).
Header peek_header(std::span<const std::byte> bytes);

// The header's 64 bytes alone, for writers whose sections live elsewhere (the CUDA path copies them to the device).
void encode_header(const Header& header, std::span<std::byte, kHeaderBytes> out);
// Validates the first kHeaderBytes of a payload of `total_bytes` bytes as peek_header does (the CUDA path reads the
// header back from device memory without copying the sections).
Header decode_header(std::span<const std::byte, kHeaderBytes> prefix, std::size_t total_bytes);

std::string_view codec_name(CodecId codec);

}  // namespace gradcomp::payload
