// dense_perf: summable codecs (fp16, bf16) compressed, allreduced in their wire type, decoded
#include "bench/comm/perf/perf_harness.h"

int main(int argc, char** argv) {
  using namespace gradcomp;
  perf::Suite suite;
  suite.name = "dense_perf";
  suite.algorithm = AllreduceAlgorithm::kDense;
  suite.default_specs = {"fp16", "bf16"};
  suite.about = "summable codecs (fp16, bf16) compressed, allreduced in their wire type, decoded";
  return perf::perf_main(suite, argc, argv);
}
