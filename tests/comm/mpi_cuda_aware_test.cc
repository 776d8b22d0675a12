// The decision whether the MPI communicator takes CUDA memory (comm/mpi/mpi_cuda_aware.h), from every combination of
// the build, Open MPI's compile-time and run-time answers and GRADCOMP_MPI_CUDA_AWARE. The communicator's use of it
// runs under mpirun in mpi_communicator_test (TakesCudaMemoryOnlyWhenCudaAware, with the variable at 0 and 1).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "comm/mpi/mpi_cuda_aware.h"
#include "gradcomp/error.h"

namespace gradcomp {
namespace {

using mpi::CudaAwareFacts;
using mpi::decide_cuda_aware;

CudaAwareFacts facts(bool has_cuda, bool built, bool runtime, std::optional<std::string> env = std::nullopt) {
  return {has_cuda, built, runtime, std::move(env)};
}

TEST(MpiCudaAware, DetectedOnlyWhenBuiltAndReportedAtRunTime) {
  EXPECT_TRUE(decide_cuda_aware(facts(true, true, true)));
  EXPECT_FALSE(decide_cuda_aware(facts(true, true, false)));   // built CUDA-aware, a library without it loaded
  EXPECT_FALSE(decide_cuda_aware(facts(true, false, false)));  // Debian's Open MPI: MPIX_CUDA_AWARE_SUPPORT 0
  EXPECT_FALSE(decide_cuda_aware(facts(false, true, true)));   // gradcomp without CUDA: no device memory to take
}

TEST(MpiCudaAware, EnvironmentForcesEitherWay) {
  EXPECT_FALSE(decide_cuda_aware(facts(true, true, true, "0")));
  EXPECT_TRUE(decide_cuda_aware(facts(true, false, false, "1")));
  EXPECT_FALSE(decide_cuda_aware(facts(false, false, false, "1")));  // still nothing to take without CUDA
  EXPECT_FALSE(decide_cuda_aware(facts(false, true, true, "0")));
}

TEST(MpiCudaAware, OtherValuesAreRefusedByName) {
  for (const char* bad : {"yes", "2", "true", " 1"}) {
    try {
      decide_cuda_aware(facts(true, true, true, bad));
      ADD_FAILURE() << "GRADCOMP_MPI_CUDA_AWARE='" << bad << "' was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("GRADCOMP_MPI_CUDA_AWARE"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gradcomp
