// What compressed_allreduce must produce, rebuilt in one process from every rank's input with no communicator: the
// composition of each algorithm written out over twin compressors (one per rank, same spec and history as that
// rank's, kept by the caller across steps), and of the hierarchical mode over them. For the allreduce tests
// (tests/comm) and the perf tools' #wrong column (bench/comm/perf).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/collectives.h"
#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"

namespace gradcomp::testing {

// Rank `rank`'s payload of `values` (f32) as compressed_allreduce's algorithms ask for it.
inline std::vector<std::byte> compress_as(Compressor& codec, std::span<const float> values, std::string_view name,
                                          std::uint64_t step, int rank, int ranks, float prescale,
                                          std::span<const TensorSegment> segments = {}) {
  CompressContext ctx;
  ctx.name = name;
  ctx.segments = segments;
  ctx.step = step;
  ctx.rank = rank;
  ctx.world_size = ranks;
  ctx.prescale = prescale;
  std::vector<std::byte> out(codec.payload_bound(values.size(), segments));
  out.resize(codec.compress(TensorView(const_cast<float*>(values.data()), values.size(), DType::kF32), out, ctx));
  return out;
}

inline std::vector<float> decode(Compressor& codec, std::span<const std::byte> payload, std::size_t numel) {
  std::vector<float> out(numel);
  codec.decompress(payload, TensorView(out.data(), numel, DType::kF32), DecodeMode::kOverwrite);
  return out;
}

// One twin compressor of `spec` per rank (the state of each rank's compressor, replayed on every rank).
inline std::vector<std::unique_ptr<Compressor>> make_twins(const std::string& spec, int ranks) {
  std::vector<std::unique_ptr<Compressor>> twins;
  for (int r = 0; r < ranks; ++r) twins.push_back(make_compressor(spec));
  return twins;
}

inline std::size_t chunk_begin(std::size_t numel, int i, int n) { return numel * i / n; }

struct Expected {
  std::vector<float> values;
  // Per element, the sum over ranks of |the term each transmitted| (dense: what the wire dtype adds; else zeros).
  std::vector<double> magnitude;
};

// One step of `algorithm` (resolved: dense, allgather, sparse or sra) over ranks whose inputs are inputs[r], each
// compressed by twins[r]. Dense: each rank's terms prescaled by 1/n for an average, summed in f32. Allgather and
// sparse: every payload decoded and added in rank order, then divided by n. Sra: chunk i of every rank compressed as
// that piece of the tensor, owner i's sum in rank order (divided by n), recompressed by owner i under "<name>#sra<i>".
inline Expected flat_reference(std::vector<std::unique_ptr<Compressor>>& twins,
                               const std::vector<std::vector<float>>& inputs, const std::string& name,
                               std::uint64_t step, AllreduceAlgorithm algorithm, ReduceOp op) {
  const int n = static_cast<int>(inputs.size());
  const std::size_t numel = inputs.empty() ? 0 : inputs[0].size();
  const float divisor = op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
  Expected out{std::vector<float>(numel, 0.0f), std::vector<double>(numel, 0.0)};
  if (algorithm != AllreduceAlgorithm::kScatterReduceAllgather) {
    const float prescale = algorithm == AllreduceAlgorithm::kDense ? 1.0f / divisor : 1.0f;
    for (int r = 0; r < n; ++r) {
      const auto decoded = decode(*twins[r], compress_as(*twins[r], inputs[r], name, step, r, n, prescale), numel);
      for (std::size_t i = 0; i < numel; ++i) out.values[i] += decoded[i];
      for (std::size_t i = 0; i < numel; ++i) out.magnitude[i] += std::fabs(static_cast<double>(decoded[i]));
    }
    if (algorithm != AllreduceAlgorithm::kDense && op == ReduceOp::kAverage && n > 1) {
      for (float& v : out.values) v /= divisor;
    }
    return out;
  }
  for (int i = 0; i < n; ++i) {
    const std::size_t b = chunk_begin(numel, i, n), e = chunk_begin(numel, i + 1, n);
    const TensorSegment piece{name, 0, e - b, b, numel};
    std::vector<float> sum(e - b, 0.0f);
    for (int s = 0; s < n; ++s) {
      const auto payload = compress_as(*twins[s], std::span(inputs[s]).subspan(b, e - b),
                                       fmt::format("{}#chunk{}", name, i), step, s, n, 1.0f, std::span(&piece, 1));
      const auto decoded = decode(*twins[i], payload, e - b);
      for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += decoded[k];
    }
    if (op == ReduceOp::kAverage && n > 1) {
      for (float& v : sum) v /= divisor;
    }
    const auto reduced = compress_as(*twins[i], sum, fmt::format("{}#sra{}", name, i), step, i, n, 1.0f);
    const auto decoded = decode(*twins[i], reduced, e - b);
    std::copy(decoded.begin(), decoded.end(), out.values.begin() + b);
  }
  return out;
}

// The world ranks of each node (ascending), nodes ordered by their first rank, as `groups` splits `world`.
inline std::vector<std::vector<int>> node_members(Communicator& world, NodeGroups& groups) {
  std::int32_t leader = world.rank();
  groups.node->broadcast(std::as_writable_bytes(std::span(&leader, 1)), 0);
  std::vector<std::int32_t> leaders(world.size());
  world.allgather(std::as_bytes(std::span(&leader, 1)), std::as_writable_bytes(std::span(leaders)));
  std::map<int, std::vector<int>> by_leader;
  for (int r = 0; r < world.size(); ++r) by_leader[leaders[r]].push_back(r);
  std::vector<std::vector<int>> nodes;
  for (auto& [first, members] : by_leader) nodes.push_back(std::move(members));
  return nodes;
}

// The inputs of the node leaders in hierarchical mode: each node's f32 sum of its ranks' inputs (nodes[k]: the world
// ranks of node k, ascending; nodes ordered by their first rank, as the leaders' communicator orders them), divided
// by the world size for an average. The sum starts from the first rank's values, so signed zeros and every bit match
// the node's allreduce whatever its order when the sums are exact (grid_gradient, or nodes of two ranks).
inline std::vector<std::vector<float>> leader_inputs(const std::vector<std::vector<float>>& inputs,
                                                     const std::vector<std::vector<int>>& nodes, ReduceOp op) {
  const float world = static_cast<float>(inputs.size());
  std::vector<std::vector<float>> out;
  for (const auto& members : nodes) {
    std::vector<float> sum = inputs[members.front()];
    for (std::size_t m = 1; m < members.size(); ++m) {
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += inputs[members[m]][i];
    }
    if (op == ReduceOp::kAverage) {
      for (float& v : sum) v /= world;
    }
    out.push_back(std::move(sum));
  }
  return out;
}

// `values` rounded to multiples of 2^-16: a sum of such values is exact in f32, in any order, while its partial sums
// stay below 2^8 in magnitude (8 + 16 bits fit the 24-bit significand): nodes of up to 51 ranks of make_gradient
// (|v| <= 5) or 128 of the perf tools' fill_gradient (|v| <= 2).
inline std::vector<float> on_grid(std::vector<float> values) {
  for (float& v : values) v = std::ldexp(std::nearbyint(std::ldexp(v, 16)), -16);
  return values;
}

}  // namespace gradcomp::testing
