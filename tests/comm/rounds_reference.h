// The expected result of the rounds algorithm (PowerSGD, the one rounds codec) for a rows x cols tensor, read from
// the codec's canonical spec: the independent reference of tests/compressors/powersgd_reference.h where the codec
// compresses the matrix, else the plain sum (the tensor travels uncompressed: a vector, or a matrix for which
// rank * (rows + cols) * min_compression_rate >= rows * cols). For the allreduce tests and the perf tools.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"
#include "tests/compressors/powersgd_reference.h"

namespace gradcomp::testing {

// A parameter of a codec's canonical spec ("" when absent).
inline std::string spec_param(const Compressor& codec, const std::string& key) {
  for (const auto& [k, v] : parse_spec(codec.spec()).params) {
    if (k == key) return v;
  }
  return "";
}

class RoundsReference {
 public:
  // Empty when the spec asks for what the reference does not model (start_step > 0, orth_eps > 0).
  static std::optional<RoundsReference> make(const Compressor& codec, const std::string& name, std::size_t rows,
                                             std::size_t cols, int ranks) {
    if (std::stod(spec_param(codec, "start_step")) != 0 || std::stod(spec_param(codec, "orth_eps")) != 0) {
      return std::nullopt;
    }
    const std::size_t rank = std::stoul(spec_param(codec, "rank"));
    const double rate = std::stod(spec_param(codec, "min_compression_rate"));
    RoundsReference out;
    if (rows > 1 && cols > 1 && static_cast<double>(rank) * static_cast<double>(rows + cols) * rate <
                                    static_cast<double>(rows) * static_cast<double>(cols)) {
      const bool on = [](const std::string& v) { return v == "on" || v == "true" || v == "1"; }(
          spec_param(codec, "warm_start"));
      out.lowrank_ = std::make_shared<PowerSgdReference>(name, rows, cols, rank, ranks, spec_param(codec, "ef") != "off",
                                                         on, std::stoull(spec_param(codec, "seed")));
    }
    return out;
  }

  // The result of step `step` when rank r holds inputs[r] (the average over ranks, or the sum).
  std::vector<double> step(const std::vector<std::vector<float>>& inputs, std::uint64_t step, bool average) {
    if (lowrank_) return lowrank_->step(inputs, step, average);
    std::vector<double> sum(inputs.empty() ? 0 : inputs[0].size(), 0.0);
    for (const auto& input : inputs) {
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += input[i];
    }
    if (average) {
      for (double& v : sum) v /= static_cast<double>(inputs.size());
    }
    return sum;
  }

  bool compresses() const { return lowrank_ != nullptr; }

 private:
  std::shared_ptr<PowerSgdReference> lowrank_;
};

}  // namespace gradcomp::testing
