// The decode-robustness harness shared by the libFuzzer target (decode_fuzz.cc) and the deterministic CTest
// (decode_mutation_test.cc): feed bytes to the decoder of a registered codec and check the contract of
// Compressor::decompress — it either succeeds (writing only within the output tensor, which sanitizers check) or
// throws CorruptPayload / InvalidArgument and leaves the output untouched. Anything else is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compressors/framework/payload.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/half_ops.cuh"
#include "kernels/philox_ops.cuh"

namespace gradcomp::fuzz {

// Largest output tensor the harness allocates (payloads claiming more are decoded against a smaller tensor, which
// must be refused).
inline constexpr std::size_t kMaxFuzzNumel = std::size_t{1} << 16;

// What one decode attempt did.
enum class Outcome { kDecoded, kRejected };

// A contract violation (an exception of the wrong type, or a rejected payload that wrote to the output).
struct Violation : std::exception {
  std::string message;
  explicit Violation(std::string text) : message(std::move(text)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

// Every registered codec with its default spec, plus variants whose payloads take other decode paths.
inline std::vector<std::string> fuzz_specs() {
  std::vector<std::string> specs;
  for (const auto& info : default_registry().list()) specs.push_back(info.name);
  const char* variants[] = {"topk:values=f16", "topk:k=3", "blocktopk:block=3", "randomk:ratio=0.5",
                            "dgc:warmup_steps=1"};
  for (const char* variant : variants) {
    const std::string name(variant, std::strchr(variant, ':'));
    if (default_registry().contains(name)) specs.push_back(variant);
  }
  return specs;
}

// One decoder per spec, created once.
class DecodeHarness {
 public:
  DecodeHarness() {
    for (const auto& spec : fuzz_specs()) {
      specs_.push_back(spec);
      compressors_.push_back(make_compressor(spec));
      encoders_.push_back(make_compressor(spec));
    }
  }

  std::size_t size() const { return compressors_.size(); }
  const std::string& spec(std::size_t i) const { return specs_[i]; }
  Compressor& compressor(std::size_t i) { return *compressors_[i]; }

  // Decodes `bytes` with codec `index` into an output of `numel` elements of `dtype` (f32, f16 or bf16), filled with
  // a sentinel first; throws Violation on a contract breach.
  Outcome decode(std::size_t index, std::span<const std::byte> bytes, std::size_t numel, DType dtype,
                 DecodeMode mode) {
    const std::size_t element = dtype == DType::kF32 ? 4 : 2;
    std::vector<std::byte> out(numel * element, std::byte{0x5a});
    const std::vector<std::byte> before = out;
    const TensorView view(numel > 0 ? out.data() : nullptr, numel, dtype);
    try {
      compressors_[index]->decompress(bytes, view, mode);
      return Outcome::kDecoded;
    } catch (const CorruptPayload&) {
    } catch (const InvalidArgument&) {
    } catch (const std::exception& error) {
      throw Violation(specs_[index] + ": decoder threw a non-gradcomp error: " + error.what());
    }
    if (out != before) throw Violation(specs_[index] + ": a rejected payload wrote to the output tensor");
    return Outcome::kRejected;
  }

  // The element count a payload claims, capped to what the harness allocates.
  static std::size_t claimed_numel(std::span<const std::byte> bytes) {
    if (bytes.size() < payload::kHeaderBytes) return 16;
    std::uint64_t numel;
    std::memcpy(&numel, bytes.data() + 8, sizeof(numel));
    return numel <= kMaxFuzzNumel ? static_cast<std::size_t>(numel) : kMaxFuzzNumel;
  }

  // A valid payload of codec `index` for a deterministic gradient of `numel` elements (second compress step, so
  // error feedback is active). Returns empty if the codec refuses the tensor.
  std::vector<std::byte> valid_payload(std::size_t index, std::size_t numel, std::uint64_t seed) {
    Compressor* encoder = encoders_[index].get();
    encoder->reset_state();
    std::vector<float> grad(numel);
    const auto stream = kernels::PhiloxStream::make(seed, 0xf022, 0);
    for (std::size_t i = 0; i < numel; ++i) grad[i] = kernels::uniform01(stream.bits(i)) * 2.0f - 1.0f;
    const auto view = TensorView::of(std::span<const float>(grad));
    try {
      CompressContext ctx;
      ctx.name = "fuzz";
      compress_to_vector(*encoder, view, ctx);
      ctx.step = 1;
      return compress_to_vector(*encoder, view, ctx);
    } catch (const InvalidArgument&) {
      return {};
    }
  }

 private:
  std::vector<std::string> specs_;
  std::vector<std::unique_ptr<Compressor>> compressors_;
  std::vector<std::unique_ptr<Compressor>> encoders_;  // separate instances: encoding must not touch the decoders
};

// The fuzz input format, shared so a crash found by libFuzzer replays in the CTest:
//   byte 0: codec index (mod the number of specs)
//   byte 1: bit 0 accumulate, bits 1-2 output dtype (0/3 f32, 1 f16, 2 bf16), bit 3 "valid-then-mutated"
//   raw mode:      bytes 2.. are the payload, decoded against the numel it claims (capped)
//   mutation mode: bytes 2-3 numel (little-endian, & 0x3ff), then (u16 offset, u8 xor) triples applied to a valid
//                  payload; a final odd byte truncates the payload to (its value * size / 256)
inline void run_one_input(DecodeHarness& harness, const std::uint8_t* data, std::size_t size) {
  if (size < 2 || harness.size() == 0) return;
  const std::size_t index = data[0] % harness.size();
  const DecodeMode mode = (data[1] & 1) ? DecodeMode::kAccumulate : DecodeMode::kOverwrite;
  const int dtype_bits = (data[1] >> 1) & 3;
  const DType dtype = dtype_bits == 1 ? DType::kF16 : dtype_bits == 2 ? DType::kBF16 : DType::kF32;
  if ((data[1] & 8) == 0) {
    const auto bytes = std::as_bytes(std::span(data + 2, size - 2));
    harness.decode(index, bytes, DecodeHarness::claimed_numel(bytes), dtype, mode);
    return;
  }
  if (size < 4) return;
  const std::size_t numel = (static_cast<std::size_t>(data[2]) | static_cast<std::size_t>(data[3]) << 8) & 0x3ff;
  auto bytes = harness.valid_payload(index, numel, data[2] ^ data[3]);
  if (bytes.empty()) return;
  std::size_t at = 4;
  for (; at + 3 <= size; at += 3) {
    const std::size_t offset = (static_cast<std::size_t>(data[at]) | static_cast<std::size_t>(data[at + 1]) << 8);
    bytes[offset % bytes.size()] ^= std::byte{data[at + 2]};
  }
  if (at < size) bytes.resize(bytes.size() * data[at] / 256);
  harness.decode(index, bytes, numel, dtype, mode);
}

}  // namespace gradcomp::fuzz
