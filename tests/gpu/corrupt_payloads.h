// Corrupt payloads of the sparse codecs and the CorruptPayload message each must be refused with: the same message
// from the CPU decoder (tests/compressors/payload_checks_test.cc, every build) and from the CUDA decoder
// (tests/gpu/payload_checks_gpu_test.cc), since both run the checks of compressors/framework/sparse_checks.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"

namespace gradcomp::corrupt {

inline constexpr std::size_t kNumel = 1000;  // blocktopk:block=64: 16 blocks, the last one 40 values

struct Case {
  std::string name;
  std::string spec;
  // Changes a valid payload (header fields or section bytes, never its length) and returns the message it must be
  // refused with.
  std::function<std::string(std::vector<std::byte>&)> corrupt;
};

inline payload::Header header_of(const std::vector<std::byte>& bytes) {
  return payload::decode_header(std::span<const std::byte, payload::kHeaderBytes>(bytes.data(), payload::kHeaderBytes),
                                bytes.size());
}

inline void set_header(std::vector<std::byte>& bytes, const payload::Header& header) {
  payload::encode_header(header, std::span<std::byte, payload::kHeaderBytes>(bytes.data(), payload::kHeaderBytes));
}

// A gradient whose largest values lie in the first blocks (so blocktopk never chooses the short last block).
inline std::vector<float> gradient() {
  std::vector<float> values(kNumel);
  for (std::size_t i = 0; i < kNumel; ++i) values[i] = static_cast<float>(kNumel - i) * (i % 2 ? 1.0f : -1.0f);
  return values;
}

inline std::vector<std::byte> valid_payload(const std::string& spec) {
  auto codec = make_compressor(spec);
  const std::vector<float> values = gradient();
  CompressContext ctx;
  ctx.name = "t";
  return compress_to_vector(*codec, TensorView::of(std::span<const float>(values)), ctx);
}

inline std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* codec : {"topk", "dgc"}) {
    const std::string spec = std::string(codec) + ":ratio=0.05";
    out.push_back({std::string(codec) + "_header_k", spec, [codec](std::vector<std::byte>& bytes) {
                     payload::Header header = header_of(bytes);
                     const std::size_t k = header.section_bytes[0] / 4;
                     header.param1 = static_cast<std::uint32_t>(k + 1);
                     set_header(bytes, header);
                     return fmt::format("corrupt {} payload: {} indices (header says {}) for a tensor of {} elements",
                                        codec, k, k + 1, kNumel);
                   }});
  }
  out.push_back({"topk_value_type", "topk:ratio=0.05", [](std::vector<std::byte>& bytes) {
                   payload::Header header = header_of(bytes);
                   header.param0 = 7;
                   set_header(bytes, header);
                   return std::string("corrupt topk payload: value type 7 (0 = f32, 1 = f16)");
                 }});
  out.push_back({"dgc_f16_values", "dgc:ratio=0.05", [](std::vector<std::byte>& bytes) {
                   payload::Header header = header_of(bytes);
                   header.param0 = 1;
                   set_header(bytes, header);
                   return std::string("corrupt dgc payload: value type 1 (dgc sends f32 values, type 0)");
                 }});
  out.push_back({"randomk_stream_k", "randomk:ratio=0.05", [](std::vector<std::byte>& bytes) {
                   const payload::Header header = header_of(bytes);
                   std::byte* words = bytes.data() + payload::section_offset(header, 0);
                   std::uint64_t k = 0;
                   std::memcpy(&k, words + 24, sizeof(k));
                   const std::uint64_t wrong = k + 1;
                   std::memcpy(words + 24, &wrong, sizeof(wrong));
                   return fmt::format(
                       "corrupt randomk payload: k = {} (header {}) with {} value bytes for a tensor of {} elements",
                       wrong, k, 4 * k, kNumel);
                 }});
  out.push_back({"blocktopk_header_ids", "blocktopk:ratio=0.25,block=64", [](std::vector<std::byte>& bytes) {
                   payload::Header header = header_of(bytes);
                   const std::size_t ids = header.section_bytes[0] / 4;
                   header.param1 = static_cast<std::uint32_t>(ids + 1);
                   set_header(bytes, header);
                   return fmt::format(
                       "corrupt blocktopk payload: id section of {} bytes (header says {} blocks) for 16 blocks",
                       4 * ids, ids + 1);
                 }});
  // The last id moved to the short last block: still increasing and in range, but 24 values too many are sent.
  out.push_back({"blocktopk_short_last_block", "blocktopk:ratio=0.25,block=64", [](std::vector<std::byte>& bytes) {
                   const payload::Header header = header_of(bytes);
                   const std::size_t ids = header.section_bytes[0] / 4;
                   const std::int32_t last = 15;
                   std::memcpy(bytes.data() + payload::section_offset(header, 0) + (ids - 1) * 4, &last, 4);
                   const std::size_t expected = ids * 64 - 24;
                   return fmt::format(
                       "corrupt blocktopk payload: value section has {} bytes, {} values ({} bytes) expected",
                       header.section_bytes[1], expected, expected * 4);
                 }});
  return out;
}

}  // namespace gradcomp::corrupt
