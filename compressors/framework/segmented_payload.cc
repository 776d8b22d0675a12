#include "compressors/framework/segmented_payload.h"

#include <cstring>

#include "gradcomp/error.h"

namespace gradcomp::payload {

std::size_t segmented_prefix_bytes(std::size_t parts) { return kHeaderBytes + align_up(2 * sizeof(std::uint64_t) * parts); }

std::size_t segmented_bound(std::span<const std::size_t> part_bounds) {
  std::size_t total = segmented_prefix_bytes(part_bounds.size());
  for (const std::size_t bound : part_bounds) total += align_up(bound);
  return total;
}

std::vector<Part> parse_segmented(const Header& header, std::span<const std::byte> table, std::size_t total_bytes) {
  const std::size_t count = header.param0;
  GRADCOMP_CHECK_AS(CorruptPayload,
                    is_segmented(header) && header.section_count == 2 && header.param1 == 0 && count >= 1 &&
                        header.section_bytes[0] == 2 * sizeof(std::uint64_t) * count &&
                        table.size() == header.section_bytes[0],
                    "corrupt segmented payload: {} sections, {} parts, param1 {}, a table of {} bytes",
                    header.section_count, count, header.param1, header.section_bytes[0]);
  std::vector<Part> parts(count);
  const std::size_t end = total_bytes;
  std::size_t offset = segmented_prefix_bytes(count), elements = 0;
  for (std::size_t s = 0; s < count; ++s) {
    std::uint64_t entry[2];
    std::memcpy(entry, table.data() + s * sizeof(entry), sizeof(entry));
    GRADCOMP_CHECK_AS(CorruptPayload, offset <= end && entry[1] >= kHeaderBytes && entry[1] <= end - offset &&
                                          entry[0] <= header.numel - elements,
                      "corrupt segmented payload: part {} of {} claims {} bytes at offset {} of a {}-byte payload and "
                      "{} elements ({} of {} left)",
                      s, count, entry[1], offset, end, entry[0], header.numel - elements, header.numel);
    parts[s] = Part{offset, static_cast<std::size_t>(entry[1]), elements, static_cast<std::size_t>(entry[0])};
    elements += entry[0];
    offset += s + 1 == count ? entry[1] : align_up(entry[1]);
  }
  GRADCOMP_CHECK_AS(CorruptPayload, offset == end && elements == header.numel,
                    "corrupt segmented payload: its {} parts end at byte {} of {} and cover {} of {} elements", count,
                    offset, end, elements, header.numel);
  return parts;
}

SegmentedWriter::SegmentedWriter(CodecId codec, std::uint64_t numel, DType dtype, std::size_t parts,
                                 std::size_t capacity)
    : parts_(parts), capacity_(capacity) {
  GRADCOMP_ASSERT(parts >= 1, "a segmented payload needs at least one part");
  header_.codec = codec;
  header_.numel = numel;
  header_.dtype = dtype;
  header_.flags = kSegmentedFlag;
  header_.param0 = static_cast<std::uint32_t>(parts);
  header_.section_count = 2;
  header_.section_bytes[0] = 2 * sizeof(std::uint64_t) * parts;
  table_.reserve(2 * parts);
  next_ = end_ = segmented_prefix_bytes(parts);
  GRADCOMP_CHECK(capacity >= next_, "segmented payload of {} parts needs {} bytes for its table, the buffer has {}",
                 parts, next_, capacity);
}

void SegmentedWriter::commit(std::size_t numel, std::size_t bytes) {
  GRADCOMP_CHECK(table_.size() < 2 * parts_, "segmented payload: part {} committed, only {} declared",
                 table_.size() / 2 + 1, parts_);
  GRADCOMP_CHECK(bytes <= room(), "segmented payload: part {} of {} bytes does not fit the {} bytes left",
                 table_.size() / 2, bytes, room());
  table_.push_back(numel);
  table_.push_back(bytes);
  end_ = next_ + bytes;
  const bool last = table_.size() == 2 * parts_;
  next_ = last ? end_ : align_up(end_);
  pad_ = next_ - end_;
}

std::vector<std::byte> SegmentedWriter::prefix() const {
  GRADCOMP_ASSERT(table_.size() == 2 * parts_, "segmented payload: {} of {} parts committed", table_.size() / 2,
                  parts_);
  Header header = header_;
  header.section_bytes[1] = end_ - segmented_prefix_bytes(parts_);
  std::vector<std::byte> out(segmented_prefix_bytes(parts_), std::byte{0});
  encode_header(header, std::span<std::byte, kHeaderBytes>(out.data(), kHeaderBytes));
  std::memcpy(out.data() + kHeaderBytes, table_.data(), table_.size() * sizeof(std::uint64_t));
  return out;
}

}  // namespace gradcomp::payload
