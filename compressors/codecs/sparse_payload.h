// The (index, value) payload shared by topk and dgc, and index validation shared by every sparsifier.
//
//   header: param0 = value type (0 = f32, 1 = f16 bits), param1 = k (entries), flags = 0
//   section 0: k int32 indices, strictly increasing, each in [0, numel)
//   section 1: k values (f32, or IEEE binary16 bits), value j belongs to index j
//
// Strictly increasing indices make duplicates impossible, so decoding with accumulate adds each value exactly once
// and the decoder can prove in one pass that every write is in bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "compressors/framework/payload.h"

namespace gradcomp::sparse {

enum class ValueType : std::uint32_t { kF32 = 0, kF16 = 1 };

inline std::size_t value_bytes(ValueType type) { return type == ValueType::kF16 ? 2 : 4; }

// Bytes of an (index, value) payload of k entries.
std::size_t index_value_bytes(std::size_t k, ValueType type);

// Writes the header of a k-entry payload and returns pointers to its two sections (indices, values).
struct IndexValueSections {
  std::int32_t* indices;
  std::byte* values;
  std::size_t total_bytes;
};
// The header of an index + value payload (topk, dgc): section 0 = k int32 indices, section 1 = k values of `type`.
payload::Header index_value_header(payload::CodecId codec, std::uint64_t numel, DType dtype, std::size_t k,
                                   ValueType type);

// The bytes of random-k's section 0: the Philox stream words (seed, tensor key, step, k) its indices come from.
inline constexpr std::size_t kRandomKStreamBytes = 4 * sizeof(std::uint64_t);

// The header of a random-k payload: section 0 = the stream words, section 1 = k f32 values.
payload::Header randomk_header(std::uint64_t numel, DType dtype, std::size_t k);

IndexValueSections write_index_value_header(payload::CodecId codec, std::uint64_t numel, DType dtype, std::size_t k,
                                            ValueType type, std::span<std::byte> out);

// Throws CorruptPayload unless `view` is a valid (index, value) payload of `codec` for `numel` elements
// (compressors/framework/sparse_checks.h: the layout checks shared with the CUDA decoder, then the indices); writes nothing.
void validate_index_value(const payload::View& view, std::string_view codec, std::size_t numel);

// Validates an (index, value) payload of `codec` completely, then writes (or adds) its values into out[0, numel);
// positions not named by an index become 0 unless accumulating. Throws CorruptPayload before any write.
void decode_index_value(const payload::View& view, std::string_view codec, float* out, std::size_t numel,
                        bool accumulate);

}  // namespace gradcomp::sparse
