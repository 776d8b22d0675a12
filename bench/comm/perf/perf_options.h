// Command line of the allreduce perf tools (bench/comm/perf/*_perf.cc): one parser and one --help for all of them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gradcomp/collectives.h"

namespace gradcomp::perf {

// What one tool measures: its name (for --help and headers), its algorithm (kAuto: each spec's own, one table per
// algorithm) and the specs it runs when --specs is not given.
struct Suite {
  std::string name;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::vector<std::string> default_specs;
  std::string about;  // one line for --help
  std::size_t rows = 0;  // the tensor seen as rows x numel/rows (0: a vector); low-rank codecs need a matrix
};

struct Config {
  std::size_t min_bytes = 4 << 10, max_bytes = std::size_t{256} << 20;
  std::size_t factor = 4;
  std::vector<std::string> specs;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  int iters = 5;
  bool json = false;
  bool check = true;  // the reference and ranks-identical checks
  std::string baseline = "none";  // each table's reference row (speedup 1); "none" outside hierarchical/auto: plain
  bool hierarchical = false;
  bool hierarchy_auto = false;  // per row, flat or hierarchical as the learned link model predicts faster
  std::string backend = "mpi";
  int local_ranks = 4;
  double timeout_s = 600;
  std::size_t rows = 0;
};

// Parses argv for `suite` (prints --help and exits 0 on -h); throws InvalidArgument naming a bad option or spec.
Config parse_args(const Suite& suite, int argc, char** argv);

// "fp16;qsgd:bits=4,bucket=512,topk:ratio=0.01" -> specs; a ',' followed by key=value continues the previous spec.
std::vector<std::string> split_specs(const std::string& list);

}  // namespace gradcomp::perf
