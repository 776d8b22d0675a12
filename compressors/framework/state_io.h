// Little-endian serialization helpers for compressor state. Readers are bounds-checked: reading past the end throws
// CorruptPayload, so damaged checkpoints never read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gradcomp/error.h"

namespace gradcomp {

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&value, sizeof(T));
  }
  void put_string(std::string_view text) {
    put<std::uint64_t>(text.size());
    append(text.data(), text.size());
  }
  template <typename T>
  void put_array(std::span<const T> values) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<std::uint64_t>(values.size());
    append(values.data(), values.size_bytes());
  }
  std::vector<std::byte> take() { return std::move(buffer_); }

 private:
  void append(const void* data, std::size_t size) {
    if (size == 0) return;
    const std::size_t offset = buffer_.size();
    buffer_.resize(offset + size);
    std::memcpy(buffer_.data() + offset, data, size);
  }
  std::vector<std::byte> buffer_;
};

class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, std::string_view what) : bytes_(bytes), what_(what) {}

  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const auto size = get<std::uint64_t>();
    need(size);
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), size);
    offset_ += size;
    return text;
  }
  template <typename T>
  std::vector<T> get_array() {
    const auto count = get<std::uint64_t>();
    GRADCOMP_CHECK_AS(CorruptPayload, count <= (bytes_.size() - offset_) / sizeof(T),
                      "corrupt {}: array of {} elements overruns the {} bytes left", what_, count,
                      bytes_.size() - offset_);
    std::vector<T> values(count);
    // An empty vector's data() may be null, and memcpy from/to null is undefined even for 0 bytes (UBSan).
    if (count > 0) std::memcpy(values.data(), bytes_.data() + offset_, count * sizeof(T));
    offset_ += count * sizeof(T);
    return values;
  }
  bool at_end() const { return offset_ == bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - offset_; }

 private:
  void need(std::size_t size) const {
    GRADCOMP_CHECK_AS(CorruptPayload, size <= bytes_.size() - offset_,
                      "corrupt {}: needs {} more bytes at offset {} but only {} are left", what_, size, offset_,
                      bytes_.size() - offset_);
  }
  std::span<const std::byte> bytes_;
  std::string what_;
  std::size_t offset_ = 0;
};

// The envelope every codec's state shares (ErrorFeedbackCompressor's codecs and PowerSGD alike): u32 magic "GCST",
// u16 version 1, the codec's registry name, then a u64 count of tensor records.
inline constexpr std::uint32_t kCodecStateMagic = 0x54534347u;  // "GCST"
inline constexpr std::uint16_t kCodecStateVersion = 1;

inline void write_state_envelope(ByteWriter& writer, std::string_view codec, std::uint64_t tensors) {
  writer.put<std::uint32_t>(kCodecStateMagic);
  writer.put<std::uint16_t>(kCodecStateVersion);
  writer.put_string(codec);
  writer.put<std::uint64_t>(tensors);
}

// Validates the envelope for `codec` (CorruptPayload for bad magic or version, InvalidArgument for another codec's
// state) and returns the count of tensor records that follow.
inline std::uint64_t read_state_envelope(ByteReader& reader, std::string_view codec) {
  const auto magic = reader.get<std::uint32_t>();
  GRADCOMP_CHECK_AS(CorruptPayload, magic == kCodecStateMagic, "corrupt compressor state: bad magic {:#010x}", magic);
  const auto version = reader.get<std::uint16_t>();
  GRADCOMP_CHECK_AS(CorruptPayload, version == kCodecStateVersion, "compressor state version {} is not supported (reads {})",
                    version, kCodecStateVersion);
  const std::string saved = reader.get_string();
  GRADCOMP_CHECK(saved == codec, "cannot load state of compressor '{}' into compressor '{}'", saved, codec);
  return reader.get<std::uint64_t>();
}

// One tensor's record inside the envelope: name, element count, steps, float buffers, codec scalars.
struct StateRecord {
  std::string name;
  std::uint64_t numel = 0;
  std::uint64_t steps = 0;
  std::vector<std::vector<float>> buffers;
  std::vector<double> scalars;
};

inline void write_state_record(ByteWriter& writer, std::string_view name, std::uint64_t numel, std::uint64_t steps,
                               std::span<const std::vector<float>> buffers, std::span<const double> scalars) {
  writer.put_string(name);
  writer.put<std::uint64_t>(numel);
  writer.put<std::uint64_t>(steps);
  writer.put<std::uint64_t>(buffers.size());
  for (const auto& buffer : buffers) writer.put_array<float>(buffer);
  writer.put_array<double>(scalars);
}

inline StateRecord read_state_record(ByteReader& reader) {
  StateRecord record;
  record.name = reader.get_string();
  record.numel = reader.get<std::uint64_t>();
  record.steps = reader.get<std::uint64_t>();
  const auto buffers = reader.get<std::uint64_t>();
  GRADCOMP_CHECK_AS(CorruptPayload, buffers <= 16, "corrupt compressor state: tensor '{}' claims {} buffers",
                    record.name, buffers);
  for (std::uint64_t b = 0; b < buffers; ++b) record.buffers.push_back(reader.get_array<float>());
  record.scalars = reader.get_array<double>();
  return record;
}

}  // namespace gradcomp
