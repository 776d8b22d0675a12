// device_path_bench's independent reference for host tensors: what two steps of the fused runtime on one rank must
// make of each tensor, from the codec alone. By the fusion rule each tensor is compressed as if alone, under its own
// name and step (tests/comm/flat_reference.h, one rank; PowerSGD: tests/comm/rounds_reference.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "tests/comm/flat_reference.h"
#include "tests/comm/rounds_reference.h"
#include "tests/comm/sum_bound.h"

namespace gradcomp::bench {

struct TensorExpected {
  std::vector<float> values;
  std::vector<double> bounds;
};

// Tensor t (named "g<t>", viewed as rows[t] rows, 0 = a vector) holds inputs[t] at the first step and that step's
// result at the second (the runtime reduces in place); returns the results of the second step with each element's
// bound (1e-4 of the tensor's largest magnitude for rounds, as its tests).
inline std::vector<TensorExpected> one_rank_reference(const std::string& spec,
                                                      const std::vector<std::vector<float>>& inputs,
                                                      const std::vector<std::size_t>& rows) {
  auto twins = testing::make_twins(spec, 1);
  const CompressorTraits traits = twins[0]->traits();
  const AllreduceAlgorithm algorithm = resolve_algorithm(traits, AllreduceAlgorithm::kAuto);
  std::vector<TensorExpected> out;
  for (std::size_t t = 0; t < inputs.size(); ++t) {
    const std::string name = fmt::format("g{}", t);
    const std::size_t numel = inputs[t].size();
    if (algorithm == AllreduceAlgorithm::kRounds) {
      auto ref = testing::RoundsReference::make(*twins[0], name, rows[t], rows[t] ? numel / rows[t] : numel, 1);
      GRADCOMP_CHECK(ref.has_value(), "device_path_bench: no reference for '{}'", spec);
      std::vector<float> input = inputs[t];
      std::vector<double> values;
      for (std::uint64_t step = 0; step < 2; ++step) {
        values = ref->step({input}, step, true);
        input.assign(values.begin(), values.end());
      }
      double scale = 0;
      for (double v : values) scale = std::max(scale, std::fabs(v));
      out.push_back({std::vector<float>(values.begin(), values.end()), std::vector<double>(numel, 1e-4 * scale)});
      continue;
    }
    testing::Expected ref{inputs[t], {}};
    for (std::uint64_t step = 0; step < 2; ++step) {
      ref = testing::flat_reference(twins, {ref.values}, name, step, algorithm, ReduceOp::kAverage);
    }
    auto bounds = testing::element_bounds(ref.values, ref.magnitude, algorithm, traits.wire_dtype, 1);
    out.push_back({std::move(ref.values), std::move(bounds)});
  }
  return out;
}

}  // namespace gradcomp::bench
