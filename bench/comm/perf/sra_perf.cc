// sra_perf: scatter-reduce-allgather with re-quantization of each rank's reduced chunk
#include "bench/comm/perf/perf_harness.h"

int main(int argc, char** argv) {
  using namespace gradcomp;
  perf::Suite suite;
  suite.name = "sra_perf";
  suite.algorithm = AllreduceAlgorithm::kScatterReduceAllgather;
  suite.default_specs = {"qsgd:bits=4", "qsgd:bits=8", "terngrad"};
  suite.about = "scatter-reduce-allgather with re-quantization of each rank's reduced chunk";
  return perf::perf_main(suite, argc, argv);
}
