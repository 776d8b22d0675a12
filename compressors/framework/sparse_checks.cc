#include "compressors/framework/sparse_checks.h"

#include <cstring>

#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"

namespace gradcomp::sparse {

void check_index_limit(std::string_view codec, std::size_t numel) {
  GRADCOMP_CHECK(numel <= kMaxIndexable,
                 "compressor '{}': {} elements exceed its int32 index limit of {} (split the tensor or use a "
                 "dense codec)",
                 codec, numel, kMaxIndexable);
}

void check_indexable(std::string_view codec, std::string_view tensor, std::size_t numel) {
  GRADCOMP_CHECK(numel <= kMaxIndexable, "compressor '{}': tensor '{}' has {} elements (at most {} supported)", codec,
                 tensor, numel, kMaxIndexable);
}

std::size_t check_index_value_layout(const payload::View& view, std::string_view codec, std::size_t numel) {
  const payload::Header& header = view.header;
  GRADCOMP_CHECK_AS(CorruptPayload, header.section_count == 2 && header.flags == 0,
                    "corrupt {} payload: {} sections and flags {:#x} (expected 2 sections, flags 0)", codec,
                    header.section_count, header.flags);
  GRADCOMP_CHECK_AS(CorruptPayload, header.param0 <= 1, "corrupt {} payload: value type {} (0 = f32, 1 = f16)", codec,
                    header.param0);
  const auto type = static_cast<ValueType>(header.param0);
  const std::size_t index_bytes = view.sections[0].size();
  GRADCOMP_CHECK_AS(CorruptPayload, index_bytes % sizeof(std::int32_t) == 0,
                    "corrupt {} payload: index section of {} bytes is not a whole number of int32", codec,
                    index_bytes);
  const std::size_t k = index_bytes / sizeof(std::int32_t);
  GRADCOMP_CHECK_AS(CorruptPayload, k <= numel && header.param1 == k,
                    "corrupt {} payload: {} indices (header says {}) for a tensor of {} elements", codec, k,
                    header.param1, numel);
  GRADCOMP_CHECK_AS(CorruptPayload, view.sections[1].size() == k * value_bytes(type),
                    "corrupt {} payload: value section has {} bytes, {} entries of {} bytes expected", codec,
                    view.sections[1].size(), k, value_bytes(type));
  return k;
}

void check_dgc_value_type(const payload::Header& header) {
  GRADCOMP_CHECK_AS(CorruptPayload, header.param0 == static_cast<std::uint32_t>(ValueType::kF32),
                    "corrupt dgc payload: value type {} (dgc sends f32 values, type 0)", header.param0);
}

std::uint64_t check_randomk_layout(const payload::View& view, std::span<const std::byte> stream, std::size_t numel) {
  const payload::Header& header = view.header;
  GRADCOMP_CHECK_AS(CorruptPayload,
                    header.section_count == 2 && header.flags == 0 && header.param0 == 0 &&
                        view.sections[0].size() == kRandomKStreamBytes && stream.size() >= kRandomKStreamBytes,
                    "corrupt randomk payload: {} sections, flags {:#x}, param0 {}, stream section {} bytes "
                    "(expected 2, 0, 0, {})",
                    header.section_count, header.flags, header.param0, view.sections[0].size(), kRandomKStreamBytes);
  GRADCOMP_CHECK_AS(CorruptPayload, numel <= kMaxIndexable, "corrupt randomk payload: {} elements (at most {})",
                    numel, kMaxIndexable);
  std::uint64_t words[4];
  std::memcpy(words, stream.data(), sizeof(words));
  const std::uint64_t k = words[3];
  GRADCOMP_CHECK_AS(CorruptPayload, k <= numel && header.param1 == k && view.sections[1].size() == k * sizeof(float),
                    "corrupt randomk payload: k = {} (header {}) with {} value bytes for a tensor of {} elements", k,
                    header.param1, view.sections[1].size(), numel);
  return k;
}

BlockIds check_blocktopk_ids(const payload::View& view, std::size_t numel) {
  const payload::Header& header = view.header;
  GRADCOMP_CHECK_AS(CorruptPayload,
                    header.section_count == 2 && header.flags == 0 && header.param0 >= 1 &&
                        header.param0 <= kMaxBlock && numel <= kMaxIndexable,
                    "corrupt blocktopk payload: {} sections, flags {:#x}, block {}, {} elements", header.section_count,
                    header.flags, header.param0, numel);
  BlockIds ids;
  ids.block = header.param0;
  ids.blocks = (numel + ids.block - 1) / ids.block;
  const std::size_t id_bytes = view.sections[0].size();
  GRADCOMP_CHECK_AS(CorruptPayload,
                    id_bytes % sizeof(std::int32_t) == 0 && id_bytes / 4 <= ids.blocks && header.param1 == id_bytes / 4,
                    "corrupt blocktopk payload: id section of {} bytes (header says {} blocks) for {} blocks", id_bytes,
                    header.param1, ids.blocks);
  ids.count = id_bytes / sizeof(std::int32_t);
  return ids;
}

void check_blocktopk_values(const payload::View& view, const BlockIds& ids, std::size_t numel, std::size_t last) {
  std::size_t expected = ids.count * ids.block;
  if (ids.count > 0 && last == ids.blocks - 1) expected -= ids.blocks * ids.block - numel;
  GRADCOMP_CHECK_AS(CorruptPayload, view.sections[1].size() == expected * sizeof(float),
                    "corrupt blocktopk payload: value section has {} bytes, {} values ({} bytes) expected",
                    view.sections[1].size(), expected, expected * sizeof(float));
}

void check_indices_flag(bool ok, std::string_view codec, std::uint64_t limit, std::size_t count) {
  GRADCOMP_CHECK_AS(CorruptPayload, ok,
                    "corrupt {} payload: indices are not strictly increasing and in [0, {}) ({} entries)", codec,
                    limit, count);
}

void validate_increasing_indices(std::span<const std::byte> indices, std::size_t count, std::uint64_t limit,
                                 std::string_view what) {
  long long previous = -1;
  for (std::size_t j = 0; j < count; ++j) {
    std::int32_t index;
    std::memcpy(&index, indices.data() + j * sizeof(index), sizeof(index));
    GRADCOMP_CHECK_AS(CorruptPayload, index > previous && static_cast<std::uint64_t>(index) < limit,
                      "corrupt {} payload: index #{} is {} (previous {}, limit {}); indices must be strictly "
                      "increasing and in range",
                      what, j, index, previous, limit);
    previous = index;
  }
}

}  // namespace gradcomp::sparse
