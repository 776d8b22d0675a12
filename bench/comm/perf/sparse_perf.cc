// sparse_perf: sparse payloads allgathered, switching to a dense allreduce when their union is dense
#include "bench/comm/perf/perf_harness.h"

int main(int argc, char** argv) {
  using namespace gradcomp;
  perf::Suite suite;
  suite.name = "sparse_perf";
  suite.algorithm = AllreduceAlgorithm::kSparseAllreduce;
  suite.default_specs = {"topk:ratio=0.01", "blocktopk:ratio=0.01", "dgc:ratio=0.001", "topk:ratio=0.3"};
  suite.about = "sparse payloads allgathered, switching to a dense allreduce when their union is dense";
  return perf::perf_main(suite, argc, argv);
}
