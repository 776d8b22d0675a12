#include "gradcomp/compressor.h"

#include <vector>

#include <fmt/ranges.h>

#include "gradcomp/error.h"

namespace gradcomp {

std::string describe_traits(const CompressorTraits& traits) {
  std::vector<std::string> parts;
  if (traits.summable) parts.push_back(fmt::format("summable({})", dtype_name(traits.wire_dtype)));
  if (traits.gatherable) parts.emplace_back("gatherable");
  if (traits.requantizable) parts.emplace_back("requantizable");
  if (traits.rounds) parts.emplace_back("rounds");
  parts.emplace_back(traits.lossy ? "lossy" : "lossless");
  return fmt::format("{}", fmt::join(parts, ","));
}

std::unique_ptr<RoundReduction> Compressor::begin_rounds(const TensorView& tensor, const CompressContext& ctx) {
  (void)tensor;
  throw InvalidArgument(fmt::format("compressor '{}' is not reduced in rounds (traits: {}); tensor '{}' on rank {}",
                                    spec(), describe_traits(traits()), ctx.name, ctx.rank));
}

void Compressor::decompress_sum(std::span<const PayloadBytes> payloads, const TensorView& out, DecodeMode first) {
  for (const PayloadBytes& payload : payloads) {  // before any payload is written
    GRADCOMP_CHECK(!out.device().is_cpu() || payload.memory.is_host(),
                   "compressor '{}': a payload in {} memory cannot be decoded into {} (a CPU output takes host "
                   "payloads)", name(), device_name(payload.memory.device), out.describe());
  }
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    decompress(payloads[i], out, i == 0 ? first : DecodeMode::kAccumulate);
  }
}

std::size_t Compressor::payload_bound(std::size_t numel, std::span<const TensorSegment>) const {
  return max_payload_bytes(numel);
}

std::size_t Compressor::expected_payload_bytes(std::size_t numel, std::size_t) const {
  return max_payload_bytes(numel);
}

std::vector<std::byte> compress_to_vector(Compressor& compressor, const TensorView& grad, const CompressContext& ctx) {
  GRADCOMP_CHECK(grad.device().is_cpu(), "compress_to_vector needs a CPU tensor, got {}", grad.describe());
  std::vector<std::byte> out(compressor.payload_bound(grad.numel(), ctx.segments));
  out.resize(compressor.compress(grad, out, ctx));
  return out;
}

}  // namespace gradcomp
