// allreduce_perf: every spec under the algorithm its traits call for, one table per algorithm, against the plain
// dense allreduce
#include "bench/comm/perf/perf_harness.h"

int main(int argc, char** argv) {
  using namespace gradcomp;
  perf::Suite suite;
  suite.name = "allreduce_perf";
  suite.algorithm = AllreduceAlgorithm::kAuto;
  suite.default_specs = {"fp16", "qsgd:bits=4", "topk:ratio=0.01", "dgc:ratio=0.001"};
  suite.about = "each spec under the algorithm its traits call for (one table per algorithm)";
  return perf::perf_main(suite, argc, argv);
}
