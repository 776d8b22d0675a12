#include "bench/comm/perf/perf_reference.h"

#include <span>

#include <fmt/format.h>

#include "gradcomp/registry.h"

namespace gradcomp::perf {
namespace {

std::vector<std::byte> compress_as(Compressor& codec, std::span<const float> values, std::string_view name, int rank,
                                   int n, float prescale, std::span<const TensorSegment> segments = {}) {
  CompressContext ctx;
  ctx.name = name;
  ctx.segments = segments;
  ctx.rank = rank;
  ctx.world_size = n;
  ctx.prescale = prescale;
  std::vector<std::byte> out(codec.payload_bound(values.size(), segments));
  out.resize(codec.compress(TensorView(const_cast<float*>(values.data()), values.size(), DType::kF32), out, ctx));
  return out;
}

}  // namespace

void fill_gradient(std::vector<float>& values, int rank) {
  const std::uint64_t seed = 0x6772616463ull + (static_cast<std::uint64_t>(rank) << 40);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    const float v = static_cast<float>((z >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    values[i] = (u - 0.5f) * (0.01f + 4.0f * v * v * v * v);
  }
}

std::optional<std::vector<float>> reference(const std::string& spec, AllreduceAlgorithm algorithm, bool plain,
                                            std::size_t numel, int n) {
  std::vector<float> ref(numel, 0.0f), grad(numel), decoded;
  if (plain) {
    for (int r = 0; r < n; ++r) {
      fill_gradient(grad, r);
      for (std::size_t i = 0; i < numel; ++i) ref[i] += grad[i];
    }
    for (float& v : ref) v /= static_cast<float>(n);
    return ref;
  }
  if (algorithm == AllreduceAlgorithm::kRounds) return std::nullopt;
  const bool sra = algorithm == AllreduceAlgorithm::kScatterReduceAllgather;
  const bool dense = algorithm == AllreduceAlgorithm::kDense;
  for (int r = 0; r < n; ++r) {
    fill_gradient(grad, r);
    auto twin = make_compressor(spec);
    const int chunks = sra ? n : 1;
    for (int c = 0; c < chunks; ++c) {
      const std::size_t b = numel * c / chunks, e = numel * (c + 1) / chunks;
      // Scatter-reduce-allgather compresses chunk c as the piece [b, e) of tensor "perf".
      const std::string name = sra ? fmt::format("perf#chunk{}", c) : std::string("perf");
      const TensorSegment piece{"perf", 0, e - b, b, numel};
      const auto payload = compress_as(*twin, std::span(grad).subspan(b, e - b), name, r, n,
                                       dense ? 1.0f / static_cast<float>(n) : 1.0f,
                                       sra ? std::span(&piece, 1) : std::span<const TensorSegment>{});
      decoded.assign(e - b, 0.0f);
      twin->decompress(payload, TensorView(decoded.data(), e - b, DType::kF32), DecodeMode::kOverwrite);
      for (std::size_t i = b; i < e; ++i) ref[i] += decoded[i - b];
    }
  }
  if (!dense) {
    for (float& v : ref) v /= static_cast<float>(n);
  }
  if (sra) {
    for (int c = 0; c < n; ++c) {
      const std::size_t b = numel * c / n, e = numel * (c + 1) / n;
      auto owner = make_compressor(spec);
      const auto payload = compress_as(*owner, std::span(ref).subspan(b, e - b), fmt::format("perf#sra{}", c), c, n,
                                       1.0f);
      owner->decompress(payload, TensorView(ref.data() + b, e - b, DType::kF32), DecodeMode::kOverwrite);
    }
  }
  return ref;
}

double relative_tolerance(const Compressor& codec, AllreduceAlgorithm algorithm, bool hierarchical, int n) {
  if (hierarchical) return 1e-4 * n;
  const auto wire = codec.traits().wire_dtype;
  if (algorithm == AllreduceAlgorithm::kDense && wire != DType::kF32) return (wire == DType::kF16 ? 2e-3 : 1.6e-2) * n;
  return 1e-5 * n;
}

}  // namespace gradcomp::perf
