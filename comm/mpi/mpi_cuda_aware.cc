#include "comm/mpi/mpi_cuda_aware.h"

#include <fmt/format.h>

#include "comm/mpi/mpi_support.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "src/core/env.h"

#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

namespace gradcomp::mpi {
namespace {

CudaAwareFacts facts_of_this_process() {
  CudaAwareFacts facts;
  facts.gradcomp_has_cuda = GRADCOMP_WITH_CUDA != 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  facts.mpi_built_with_cuda = true;
  facts.mpi_runtime_cuda = MPIX_Query_cuda_support() == 1;
#endif
  facts.override = env::text("GRADCOMP_MPI_CUDA_AWARE");
  return facts;
}

}  // namespace

bool decide_cuda_aware(const CudaAwareFacts& facts) {
  const bool forced_on = facts.override == "1";
  if (facts.override && !forced_on && *facts.override != "0") {
    throw InvalidArgument(fmt::format("GRADCOMP_MPI_CUDA_AWARE='{}': expected 0 (host memory only) or 1 (the MPI "
                                      "library takes CUDA memory)",
                                      *facts.override));
  }
  if (!facts.gradcomp_has_cuda || facts.override == "0") return false;
  return forced_on || (facts.mpi_built_with_cuda && facts.mpi_runtime_cuda);
}

bool cuda_aware() {
  static const bool decided = decide_cuda_aware(facts_of_this_process());
  return decided;
}

}  // namespace gradcomp::mpi
