// What the first compressed allreduce of a perf row must produce, rebuilt on one rank from every rank's gradient.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gradcomp/collectives.h"

namespace gradcomp::perf {

// Gradient of `rank`: hashed uniforms shaped into a heavy-ish tailed distribution; deterministic, so every rank can
// rebuild every other rank's gradient for the reference.
void fill_gradient(std::vector<float>& values, int rank);

// The result of the first call (fresh state, step 0) of `spec` under `algorithm` on n ranks, from what each rank's
// fresh compressor transmits; `plain`: the plain dense allreduce (the average of the gradients). Empty for an
// algorithm with no closed-form reference here (rounds: the codec's own tests check it against NumPy).
std::optional<std::vector<float>> reference(const std::string& spec, AllreduceAlgorithm algorithm, bool plain,
                                            std::size_t numel, int n);

// The tolerance of a row against its reference, relative to the reference's largest magnitude.
double relative_tolerance(const Compressor& codec, AllreduceAlgorithm algorithm, bool hierarchical, int n);

}  // namespace gradcomp::perf
