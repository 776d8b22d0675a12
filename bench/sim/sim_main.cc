// The simulated allreduce_perf: SMPI starts every rank here. MPI is initialized and finalized around the tool (the
// communicator then neither initializes MPI nor registers its exit handler, which would run after the simulation), and
// the modeled codecs (sim_modeled_codec.h) are registered first.
#include <mpi.h>

#include "bench/sim/sim_modeled_codec.h"

int allreduce_perf_main(int argc, char** argv);
namespace gradcomp::sim {
void stop_freeing();  // sim_shims.cc
}  // bench/comm/perf/allreduce_perf.cc, renamed by bench/sim/CMakeLists

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  gradcomp::sim::register_modeled_codecs();
  const int rc = allreduce_perf_main(argc, argv);
  MPI_Finalize();
  gradcomp::sim::stop_freeing();
  return rc;
}
