// Under mpirun: after a successful allreduce, the last rank dies abruptly (_Exit, no MPI_Finalize) and the survivors
// run the next compressed allreduce with a 3 s timeout. Each survivor prints one marker line saying which error it
// got and how long it took; tests/comm/mpi_dead_rank_check.sh runs the job and requires a Timeout/CommError marker
// from every survivor within the deadline (mpirun may kill the survivors afterwards; the markers are what counts).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

int main() {
  using namespace gradcomp;
  MpiOptions options;
  options.timeout = std::chrono::milliseconds(3000);
  auto world = make_mpi_world_communicator(options);
  auto codec = make_compressor("none");
  std::vector<float> x(1 << 20, 1.0f);
  compressed_allreduce(*world, *codec, TensorView::of(std::span(x)), "before");  // everyone alive
  if (world->rank() == world->size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::_Exit(17);  // a crash: no finalize, sockets torn down by the kernel
  }
  const auto start = std::chrono::steady_clock::now();
  const char* outcome = "NO-ERROR";
  std::string message;
  try {
    for (int step = 0; step < 3; ++step) {
      compressed_allreduce(*world, *codec, TensorView::of(std::span(x)), "after");
    }
  } catch (const Timeout& e) {
    outcome = "Timeout";
    message = e.what();
  } catch (const CommError& e) {
    outcome = "CommError";
    message = e.what();
  } catch (const std::exception& e) {
    outcome = "OtherError";
    message = e.what();
  }
  const long long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  std::printf("SURVIVOR rank %d of %d: %s after %lld ms: %s\n", world->rank(), world->size(), outcome, ms,
              message.c_str());
  std::fflush(stdout);
  std::_Exit(0);  // MPI is unusable after a lost peer: skip finalize
}
