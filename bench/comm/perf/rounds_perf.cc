// rounds_perf: two summable rounds with computation between them (PowerSGD), the tensor as 256 rows
#include "bench/comm/perf/perf_harness.h"

int main(int argc, char** argv) {
  using namespace gradcomp;
  perf::Suite suite;
  suite.name = "rounds_perf";
  suite.algorithm = AllreduceAlgorithm::kRounds;
  suite.default_specs = {"powersgd:rank=1", "powersgd:rank=4"};
  suite.about = "two summable rounds with computation between them (PowerSGD), the tensor as 256 rows";
  suite.rows = 256;
  return perf::perf_main(suite, argc, argv);
}
