// The segmented payload: what a codec sends for a call made of several tensors (a fusion buffer, a DDP bucket, a
// chunk holding parts of several tensors). Each segment is encoded exactly as it would be alone, into a complete
// payload of its own (a "part"), so a tensor's contribution never depends on which tensors shared its buffer:
//
//   header    codec = the codec's id, numel = all segments' elements, flags = kSegmentedFlag, param0 = part count S,
//             param1 = 0, two sections
//   section 0 S entries {u64 numel, u64 bytes}: each part's element count and exact size
//   section 1 the parts back to back, each starting at a multiple of 16 bytes of the payload (zero padding between)
//
// A decoder reads the table, slices its output by the parts' element counts and decodes each part as a plain
// payload. Summable codecs never use it (their body is summed elementwise; their segments are encoded in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compressors/framework/payload.h"

namespace gradcomp::payload {

// Header flag of a segmented payload (never set on a part: parts do not nest).
inline constexpr std::uint16_t kSegmentedFlag = 0x8000;

inline bool is_segmented(const Header& header) { return (header.flags & kSegmentedFlag) != 0; }

// Bytes before the first part: the header and the table of `parts` entries.
std::size_t segmented_prefix_bytes(std::size_t parts);

// Upper bound of a segmented payload whose parts are at most `part_bounds[s]` bytes each.
std::size_t segmented_bound(std::span<const std::size_t> part_bounds);

// One part of a segmented payload: where it lies in the payload and how many elements it decodes to.
struct Part {
  std::size_t offset = 0;  // bytes from the payload's start (a multiple of 16)
  std::size_t bytes = 0;
  std::size_t element_offset = 0;  // first element of the decoded output it covers
  std::size_t numel = 0;
};

// Lays out the parts of a segmented payload of `header` (already validated by decode_header / peek_header as a
// payload of `total_bytes` bytes and of the expected codec) from its table (section 0, host memory). Throws
// CorruptPayload unless the table has one entry per part, the parts tile section 1 exactly (16-byte alignment
// included) and their element counts add up to header.numel.
std::vector<Part> parse_segmented(const Header& header, std::span<const std::byte> table, std::size_t total_bytes);

// Writes a segmented payload: reserve the prefix, then encode each part into next_slot() and record it with
// commit(); prefix() gives the header and table once every part is in (the host writes it at the payload's start,
// the CUDA path copies it to the device).
class SegmentedWriter {
 public:
  // `parts` parts of `codec` over `numel` elements of original dtype `dtype`, into a buffer of `capacity` bytes.
  SegmentedWriter(CodecId codec, std::uint64_t numel, DType dtype, std::size_t parts, std::size_t capacity);

  // Byte offset (from the payload's start) where the next part goes, and the room left there.
  std::size_t next_offset() const { return next_; }
  std::size_t room() const { return capacity_ > next_ ? capacity_ - next_ : 0; }
  // Zero padding bytes written before the next part, [next_offset() - padding_before(), next_offset()).
  std::size_t padding_before() const { return pad_; }
  // Records the part just written at next_offset(): `numel` elements in `bytes` bytes. Throws InvalidArgument past
  // the declared part count or capacity.
  void commit(std::size_t numel, std::size_t bytes);
  // The header and the table (segmented_prefix_bytes(parts) bytes, padding zeroed); every part must be committed.
  std::vector<std::byte> prefix() const;
  // The payload's total size (valid once every part is committed).
  std::size_t total_bytes() const { return end_; }

 private:
  Header header_;
  std::size_t parts_;
  std::size_t capacity_;
  std::vector<std::uint64_t> table_;  // numel, bytes per part
  std::size_t next_ = 0, end_ = 0, pad_ = 0;
};

}  // namespace gradcomp::payload
