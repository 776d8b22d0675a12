// Shared by the comm/local and MPI allreduce tests: runs compressed_allreduce on one rank and checks it against a
// reference rebuilt on that rank from every rank's gradient (gathered raw) by twin compressors with the same spec and
// history as each rank's (tests/comm/flat_reference.h), element by element within bounds derived from the summation
// (tests/comm/sum_bound.h), and that all ranks end bit-identical.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "tests/comm/flat_reference.h"
#include "tests/comm/sum_bound.h"

namespace gradcomp::testing {

// Deterministic pseudo-random gradient of rank `rank` at `step` (mixed signs and magnitudes, a few exact zeros).
inline std::vector<float> make_gradient(std::size_t numel, int rank, std::uint64_t step, std::uint64_t salt = 0) {
  std::vector<float> values(numel);
  std::uint64_t state = 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(rank) + 1) + step * 1315423911ull + salt;
  for (std::size_t i = 0; i < numel; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(state >> 11) / 9007199254740992.0;  // [0, 1)
    values[i] = (i % 97 == 5) ? 0.0f : static_cast<float>((u - 0.5) * std::pow(10.0, 3.0 * u - 2.0));
  }
  return values;
}

// Allgather of equal-size float vectors.
inline std::vector<float> gather_floats(Communicator& comm, const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * comm.size());
  comm.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
  return all;
}

// Every rank's input, in rank order (an allgather of equal-size vectors).
inline std::vector<std::vector<float>> gather_inputs(Communicator& comm, const std::vector<float>& mine) {
  const auto all = gather_floats(comm, mine);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < comm.size(); ++r) {
    inputs.emplace_back(all.begin() + r * mine.size(), all.begin() + (r + 1) * mine.size());
  }
  return inputs;
}

// The reference of one step: what the algorithm must produce from every rank's gradient (gathered raw), rebuilt
// with the twins of every rank (flat_reference.h).
inline Expected reference_step(Communicator& comm, std::vector<std::unique_ptr<Compressor>>& twins,
                               const std::vector<float>& grad, const std::string& name, std::uint64_t step,
                               AllreduceAlgorithm algorithm, ReduceOp op) {
  return flat_reference(twins, gather_inputs(comm, grad), name, step, algorithm, op);
}

// Runs `steps` compressed allreduces of `spec` on this rank and checks every step. Returns the last stats.
inline AllreduceStats check_allreduce(Communicator& comm, const std::string& spec, AllreduceAlgorithm algorithm,
                                      std::size_t numel, int steps = 2, ReduceOp op = ReduceOp::kAverage,
                                      double sparse_switch_density = 1.0) {
  auto compressor = make_compressor(spec);
  auto twins = make_twins(spec, comm.size());
  const CompressorTraits traits = compressor->traits();
  const AllreduceAlgorithm resolved = resolve_algorithm(traits, algorithm);
  const std::string name = fmt::format("grad.{}", numel);
  AllreduceStats stats;
  for (int step = 0; step < steps; ++step) {
    const auto grad = make_gradient(numel, comm.rank(), step);
    std::vector<float> tensor = grad;
    AllreduceOptions options;
    options.algorithm = algorithm;
    options.op = op;
    options.step = step;
    options.sparse_switch_density = sparse_switch_density;
    stats = compressed_allreduce(comm, *compressor, TensorView(tensor.data(), numel, DType::kF32), name, options);
    EXPECT_EQ(stats.algorithm, resolved);
    EXPECT_EQ(stats.input_bytes, numel * 4);
    const auto ref = reference_step(comm, twins, grad, name, step, resolved, op);
    double max_error = 0;
    const auto bounds = element_bounds(ref.values, ref.magnitude, resolved, traits.wire_dtype, comm.size());
    const std::size_t wrong = count_outside(tensor, ref.values, bounds, &max_error);
    EXPECT_EQ(wrong, 0u) << fmt::format("spec {} algorithm {} ranks {} numel {} step {} rank {}: {} elements outside "
                                        "their bound (max error {})",
                                        spec, algorithm_name(resolved), comm.size(), numel, step, comm.rank(), wrong,
                                        max_error);
    // Bit-identical on every rank.
    const auto all = gather_floats(comm, tensor);
    for (int r = 1; r < comm.size(); ++r) {
      EXPECT_TRUE(numel == 0 || std::memcmp(all.data(), all.data() + r * numel, numel * sizeof(float)) == 0)
          << fmt::format("spec {} algorithm {}: rank {} differs from rank 0 (numel {}, step {})", spec,
                         algorithm_name(resolved), r, numel, step);
    }
  }
  return stats;
}

// Default spec of every registered codec (the codecs on other branches join automatically when merged).
inline std::vector<std::string> registered_specs() {
  std::vector<std::string> specs;
  for (const auto& info : default_registry().list()) specs.push_back(info.name);
  return specs;
}

}  // namespace gradcomp::testing
