#include "bench/comm/perf/perf_reference.h"

#include <algorithm>
#include <cmath>

#include "gradcomp/registry.h"
#include "tests/comm/flat_reference.h"
#include "tests/comm/rounds_reference.h"
#include "tests/comm/sum_bound.h"

namespace gradcomp::perf {
namespace {

// The plain dense allreduce: an f32 sum over n ranks, then one division; the reference's own f32 sum errs as much.
Expected plain_average(const std::vector<std::vector<float>>& inputs) {
  const int n = static_cast<int>(inputs.size());
  const std::size_t numel = inputs[0].size();
  Expected out{std::vector<float>(numel, 0.0f), std::vector<double>(numel, 0.0)};
  for (std::size_t i = 0; i < numel; ++i) {
    double magnitude = 0;
    for (const auto& input : inputs) {
      out.values[i] += input[i];
      magnitude += std::fabs(static_cast<double>(input[i]));
    }
    out.values[i] /= static_cast<float>(n);
    out.bounds[i] = 2 * testing::sum_error_bound(DType::kF32, n, magnitude / n, /*rounded_inputs=*/true);
  }
  return out;
}

std::optional<Expected> rounds(const std::string& spec, const std::vector<std::vector<float>>& inputs,
                               std::size_t rows, bool average) {
  const std::size_t numel = inputs[0].size();
  const std::size_t r = rows && numel % rows == 0 ? rows : 0;
  auto ref = testing::RoundsReference::make(*make_compressor(spec), "perf", r, r ? numel / r : numel,
                                            static_cast<int>(inputs.size()));
  if (!ref) return std::nullopt;
  const auto values = ref->step(inputs, 0, average);
  double scale = 0;
  for (double v : values) scale = std::max(scale, std::fabs(v));
  return Expected{std::vector<float>(values.begin(), values.end()),
                  std::vector<double>(numel, 1e-4 * static_cast<double>(inputs.size()) * scale + 1e-30)};
}

}  // namespace

void fill_gradient(std::vector<float>& values, int rank, bool grid) {
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
  if (grid) values = testing::on_grid(std::move(values));
}

std::optional<Expected> reference(const std::string& spec, AllreduceAlgorithm algorithm, bool plain, std::size_t numel,
                                  std::size_t rows, int n, const std::vector<std::vector<int>>& nodes, bool grid) {
  std::vector<std::vector<float>> inputs(n, std::vector<float>(numel));
  for (int r = 0; r < n; ++r) fill_gradient(inputs[r], r, grid);
  if (plain) return plain_average(inputs);
  const bool hierarchical = !nodes.empty();
  // Hierarchical: the leaders sum their nodes' averages-to-be; flat: the ranks average.
  if (hierarchical) inputs = testing::leader_inputs(inputs, nodes, ReduceOp::kAverage);
  const ReduceOp op = hierarchical ? ReduceOp::kSum : ReduceOp::kAverage;
  if (algorithm == AllreduceAlgorithm::kRounds) return rounds(spec, inputs, rows, op == ReduceOp::kAverage);
  const int ranks = static_cast<int>(inputs.size());
  auto twins = testing::make_twins(spec, ranks);
  testing::Expected ref = testing::flat_reference(twins, inputs, "perf", 0, algorithm, op);
  auto bounds = testing::element_bounds(ref.values, ref.magnitude, algorithm, twins[0]->traits().wire_dtype, ranks);
  return Expected{std::move(ref.values), std::move(bounds)};
}

}  // namespace gradcomp::perf
