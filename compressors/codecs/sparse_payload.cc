#include "compressors/codecs/sparse_payload.h"

#include <cstring>

#include "compressors/framework/sparse_checks.h"
#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"

namespace gradcomp::sparse {

std::size_t index_value_bytes(std::size_t k, ValueType type) {
  return payload::kHeaderBytes + payload::align_up(k * sizeof(std::int32_t)) + k * value_bytes(type);
}

payload::Header index_value_header(payload::CodecId codec, std::uint64_t numel, DType dtype, std::size_t k,
                                   ValueType type) {
  payload::Header header;
  header.codec = codec;
  header.numel = numel;
  header.dtype = dtype;
  header.param0 = static_cast<std::uint32_t>(type);
  header.param1 = static_cast<std::uint32_t>(k);
  header.section_count = 2;
  header.section_bytes[0] = k * sizeof(std::int32_t);
  header.section_bytes[1] = k * value_bytes(type);
  return header;
}

payload::Header randomk_header(std::uint64_t numel, DType dtype, std::size_t k) {
  payload::Header header;
  header.codec = payload::CodecId::kRandomK;
  header.numel = numel;
  header.dtype = dtype;
  header.param1 = static_cast<std::uint32_t>(k);
  header.section_count = 2;
  header.section_bytes[0] = kRandomKStreamBytes;
  header.section_bytes[1] = k * sizeof(float);
  return header;
}

IndexValueSections write_index_value_header(payload::CodecId codec, std::uint64_t numel, DType dtype, std::size_t k,
                                            ValueType type, std::span<std::byte> out) {
  const payload::Header header = index_value_header(codec, numel, dtype, k, type);
  const std::size_t total = payload::write_header(header, out);
  return {reinterpret_cast<std::int32_t*>(out.data() + payload::section_offset(header, 0)),
          out.data() + payload::section_offset(header, 1), total};
}

void validate_index_value(const payload::View& view, std::string_view codec, std::size_t numel) {
  const std::size_t k = check_index_value_layout(view, codec, numel);
  validate_increasing_indices(view.sections[0], k, numel, codec);
}

void decode_index_value(const payload::View& view, std::string_view codec, float* out, std::size_t numel,
                        bool accumulate) {
  validate_index_value(view, codec, numel);
  const payload::Header& header = view.header;
  const auto type = static_cast<ValueType>(header.param0);
  const std::size_t k = view.sections[0].size() / sizeof(std::int32_t);

  // Validated: from here on every write is in bounds.
  if (!accumulate && numel > 0) std::memset(out, 0, numel * sizeof(float));
  const std::byte* index_bytes_ptr = view.sections[0].data();
  const std::byte* value_ptr = view.sections[1].data();
  for (std::size_t j = 0; j < k; ++j) {
    std::int32_t index;
    std::memcpy(&index, index_bytes_ptr + j * sizeof(index), sizeof(index));
    float value;
    if (type == ValueType::kF16) {
      std::uint16_t bits;
      std::memcpy(&bits, value_ptr + j * sizeof(bits), sizeof(bits));
      value = kernels::half_bits_to_float(bits);
    } else {
      std::memcpy(&value, value_ptr + j * sizeof(value), sizeof(value));
    }
    if (accumulate) {
      out[index] += value;
    } else {
      out[index] = value;
    }
  }
}

}  // namespace gradcomp::sparse
