// allgather_perf: every rank's payload allgathered and decoded in rank order
#include "bench/comm/perf/perf_harness.h"

int main(int argc, char** argv) {
  using namespace gradcomp;
  perf::Suite suite;
  suite.name = "allgather_perf";
  suite.algorithm = AllreduceAlgorithm::kAllgather;
  suite.default_specs = {"qsgd:bits=4", "onebit", "topk:ratio=0.01", "randomk:ratio=0.01"};
  suite.about = "every rank's payload allgathered and decoded in rank order";
  return perf::perf_main(suite, argc, argv);
}
