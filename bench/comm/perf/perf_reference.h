// What the first compressed allreduce of a perf row must produce, rebuilt on one rank from every rank's gradient,
// with each element's bound.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gradcomp/collectives.h"

namespace gradcomp::perf {

// Gradient of `rank`: hashed uniforms shaped into a heavy-ish tailed distribution; deterministic, so every rank can
// rebuild every other rank's gradient for the reference. `grid`: rounded to multiples of 2^-16 (|v| <= 2.01), so a
// node's f32 sum in hierarchical mode is exact in any order and the reference rebuilds the leaders' inputs bit for bit.
void fill_gradient(std::vector<float>& values, int rank, bool grid = false);

// The expected values of a row and the largest error each element may show.
struct Expected {
  std::vector<float> values;
  std::vector<double> bounds;
};

// The result of the first call (fresh state, step 0) of `spec` under `algorithm` (resolved) on n ranks holding
// fill_gradient(rank, grid), viewed as `rows` rows (0: a vector): `plain`, the plain dense
// allreduce (the average); else what each rank's fresh compressor transmits, composed as the algorithm does
// (tests/comm/flat_reference.h; rounds: tests/comm/rounds_reference.h), or, when `nodes` lists the world's nodes (the
// call ran hierarchical), each node's sum divided by n, then the algorithm across the node leaders. Bounds: per
// element for dense sums (tests/comm/sum_bound.h), 1e-5 * ranks of the largest magnitude for the decoding algorithms,
// 1e-4 * ranks for rounds. Empty when the spec asks for what the rounds reference does not model.
std::optional<Expected> reference(const std::string& spec, AllreduceAlgorithm algorithm, bool plain, std::size_t numel,
                                  std::size_t rows, int n, const std::vector<std::vector<int>>& nodes, bool grid);

}  // namespace gradcomp::perf
