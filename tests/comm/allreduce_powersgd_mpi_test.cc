// PowerSGD's rounds algorithm under mpirun: tests/comm/powersgd_check.h on MPI ranks.
#include <gtest/gtest.h>

#include "tests/comm/mpi_world.h"
#include "tests/comm/powersgd_check.h"

namespace gradcomp {
namespace {

TEST(PowerSgdMpi, MatchesTheReferenceOnEveryRank) {
  Communicator& comm = testing::mpi_world();
  testing::check_powersgd_steps(comm, 40, 64, 1, ReduceOp::kAverage);
  testing::check_powersgd_steps(comm, 33, 70, 4, ReduceOp::kAverage);
  testing::check_powersgd_steps(comm, 50, 20, 2, ReduceOp::kSum);
}

TEST(PowerSgdMpi, FusedSegmentsEqualSeparateCalls) {
  testing::check_powersgd_fused_equals_separate(testing::mpi_world());
}

}  // namespace
}  // namespace gradcomp
