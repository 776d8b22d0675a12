// The metadata block of a payload: everything a decoder needs on the host before it can launch a decode, gathered
// in one place so that a payload in device memory costs one copy back and one synchronization however many parts it
// has. The same function runs on the host (host payloads, and the
// CPU test of the layout) and in one CUDA block (kernels/common_cuda.cu). Layout (bytes):
//
//   [0, kMetaLead)                         the payload's first kMetaLead bytes: its header and up to 32 bytes of
//                                          section 0 (random-k's stream words)
//   and, for a segmented payload of S parts (header flag 0x8000, param0 = S) whose block fits:
//   [kMetaLead, kMetaLead + 16 S)          its table (section 0: {u64 numel, u64 bytes} per part)
//   then kMetaLead bytes per part          the part's first bytes, at the offset the table implies (parts back to
//                                          back from byte 64 + align16(16 S), each starting at a multiple of 16)
//
// Bytes beyond the payload, or of a part that the table places outside it, are zero. Nothing is validated here: the
// host parses the block with payload::decode_header and payload::parse_segmented, which reject what is corrupt.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

inline constexpr std::size_t kMetaLead = 96;
// Parts whose leads one block gathers at most (57 KB; the host reads the parts of larger payloads one by one).
inline constexpr std::size_t kMaxMetaParts = 512;
inline constexpr std::uint16_t kMetaSegmentedFlag = 0x8000;  // payload::kSegmentedFlag

// Bytes of the metadata block of a payload of `parts` parts (0 or 1 for a plain payload).
GRADCOMP_HOST_DEVICE constexpr std::size_t meta_block_bytes(std::size_t parts) {
  return kMetaLead + (parts > 0 ? parts * (16 + kMetaLead) : 0);
}

GRADCOMP_HOST_DEVICE std::uint64_t meta_load(const unsigned char* p, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

// The part count S whose leads the block of a payload (`size` bytes at `p`) holds: 0 for a plain payload, or when S
// is 0, above kMaxMetaParts, its table does not fit the payload, or the block would exceed `capacity`.
GRADCOMP_HOST_DEVICE std::size_t meta_parts(const unsigned char* p, std::size_t size, std::size_t capacity) {
  if (size < 64) return 0;
  const auto flags = static_cast<std::uint16_t>(meta_load(p + 18, 2));
  if ((flags & kMetaSegmentedFlag) == 0) return 0;
  const std::size_t parts = static_cast<std::size_t>(meta_load(p + 24, 4));
  if (parts == 0 || parts > kMaxMetaParts || 64 + 16 * parts > size || meta_block_bytes(parts) > capacity) return 0;
  return parts;
}

// Byte offset of part `s`'s start, given the previous part's offset and byte count (s > 0), or the first part's.
GRADCOMP_HOST_DEVICE std::uint64_t meta_first_part_offset(std::size_t parts) {
  return 64 + (16 * parts + 15) / 16 * 16;
}
GRADCOMP_HOST_DEVICE std::uint64_t meta_next_part_offset(std::uint64_t offset, std::uint64_t bytes) {
  const std::uint64_t end = offset + bytes;
  return end < offset ? ~std::uint64_t{0} : (end + 15) / 16 * 16;  // saturate a corrupt size
}

// offsets[s] = where part s of the payload (`size` bytes at `p`) starts, for the meta_parts() parts. One thread.
GRADCOMP_HOST_DEVICE void meta_part_offsets(const unsigned char* p, std::size_t parts, std::uint64_t* offsets) {
  std::uint64_t offset = meta_first_part_offset(parts);
  for (std::size_t s = 0; s < parts; ++s) {
    offsets[s] = offset;
    offset = meta_next_part_offset(offset, meta_load(p + 64 + 16 * s + 8, 8));
  }
}

// Writes the block of the payload (`size` bytes at `p`) into `out` (`capacity` >= kMetaLead bytes), given the parts'
// offsets (meta_part_offsets). Thread `lane` of `lanes` copies every lanes-th byte (one thread on the host).
GRADCOMP_HOST_DEVICE void meta_copy_block(const unsigned char* p, std::size_t size, unsigned char* out,
                                                 std::size_t parts, const std::uint64_t* offsets, std::size_t lane,
                                                 std::size_t lanes) {
  const std::size_t total = meta_block_bytes(parts);
  for (std::size_t i = lane; i < total; i += lanes) {
    std::uint64_t from = i;  // the lead of the payload itself
    if (i >= kMetaLead + 16 * parts) {
      const std::size_t k = i - kMetaLead - 16 * parts;
      from = offsets[k / kMetaLead] + k % kMetaLead;  // a part's lead (saturated offsets stay out of range)
      if (from < offsets[k / kMetaLead]) from = size;
    } else if (i >= kMetaLead) {
      from = 64 + (i - kMetaLead);  // the table
    }
    out[i] = from < size ? p[from] : 0;
  }
}

// The whole block on the host (one thread).
inline std::size_t collect_payload_meta_host(const unsigned char* p, std::size_t size, unsigned char* out,
                                             std::size_t capacity, std::uint64_t* offsets) {
  const std::size_t parts = meta_parts(p, size, capacity);
  meta_part_offsets(p, parts, offsets);
  meta_copy_block(p, size, out, parts, offsets, 0, 1);
  return parts;
}

}  // namespace gradcomp::kernels
