// The payload checks of the sparse codecs, written once and run by both decoders: the CPU codecs' validate()
// (compressors/codecs/topk.cc, dgc.cc, randomk.cc, blocktopk.cc) and their CUDA backends' validate() / checked()
// (compressors/cuda/sparse_cuda_backend.cc, dgc_cuda_backend.cc). Every check here reads only the header, the section
// sizes and host bytes, so a corrupt payload is refused with the same CorruptPayload message on either path. What
// needs the sections' contents (indices strictly increasing and in range) runs on the host for the CPU decoder
// (validate_increasing_indices) and as a device check for the CUDA one (its flag read back into
// check_indices_flag).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "compressors/framework/payload.h"

namespace gradcomp::sparse {

// Element counts a sparse payload can address (int32 indices).
inline constexpr std::uint64_t kMaxIndexable = 2147483647u;
// Largest blocktopk block (its parameter's bound).
inline constexpr std::uint64_t kMaxBlock = std::uint64_t{1} << 24;

// The sparse encoders' size guards (CPU and CUDA alike), InvalidArgument unless `numel` <= kMaxIndexable:
// check_index_limit before anything is allocated (max_payload_bytes), check_indexable naming the tensor (encode).
void check_index_limit(std::string_view codec, std::size_t numel);
void check_indexable(std::string_view codec, std::string_view tensor, std::size_t numel);

// An (index, value) payload of `codec` (topk, dgc) for `numel` elements: 2 sections, flags 0, value type f32 or
// f16, whole int32 indices, k <= numel matching the header, k values. Returns k.
std::size_t check_index_value_layout(const payload::View& view, std::string_view codec, std::size_t numel);

// dgc's values are f32 (value type 0).
void check_dgc_value_type(const payload::Header& header);

// A random-k payload for `numel` elements whose stream section (section 0) starts with the host bytes `stream`:
// 2 sections, flags 0, a 32-byte stream section, k <= numel matching the header and the value bytes. Returns k.
std::uint64_t check_randomk_layout(const payload::View& view, std::span<const std::byte> stream, std::size_t numel);

// A blocktopk payload's block size, block count and id count after the checks of its header and id section.
struct BlockIds {
  std::size_t block = 0, blocks = 0, count = 0;
};
BlockIds check_blocktopk_ids(const payload::View& view, std::size_t numel);
// The value section of a blocktopk payload of `ids` whose last (largest) id is `last` (ignored when there are none):
// every chosen block whole, the last block of the tensor short.
void check_blocktopk_values(const payload::View& view, const BlockIds& ids, std::size_t numel, std::size_t last);

// The device check's outcome of `count` indices (or block ids) of `codec` below `limit`: throws unless `ok`.
void check_indices_flag(bool ok, std::string_view codec, std::uint64_t limit, std::size_t count);

// Throws CorruptPayload unless `indices` (as little-endian int32 bytes, count entries) are strictly increasing and in
// [0, limit). `what` names the codec and section for the message.
void validate_increasing_indices(std::span<const std::byte> indices, std::size_t count, std::uint64_t limit,
                                 std::string_view what);

}  // namespace gradcomp::sparse
