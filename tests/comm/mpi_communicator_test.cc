// comm/mpi under mpirun: the conformance suite (tests/comm/communicator_conformance.h; its f16/bf16 sums exercise
// the custom MPI ops), identity, thread level and node color.
#include <gtest/gtest.h>

#include <cstdint>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "tests/comm/communicator_conformance.h"
#include "tests/comm/mpi_world.h"

namespace gradcomp {
namespace {

using testing::mpi_world;

TEST(MpiCommunicator, IdentityAndThreadLevel) {
  Communicator& comm = mpi_world();
  EXPECT_EQ(comm.backend(), "mpi");
  EXPECT_GE(comm.size(), 2);
  EXPECT_NE(mpi_thread_level(), "none");
  EXPECT_EQ(comm.timeout().count(), 30000);
}

TEST(MpiCommunicator, ConformanceAllreduce) { testing::conformance_allreduce(mpi_world()); }
TEST(MpiCommunicator, ConformanceCollectives) { testing::conformance_collectives(mpi_world()); }
TEST(MpiCommunicator, ConformanceSplit) { testing::conformance_split(mpi_world()); }

TEST(MpiCommunicator, NodeColor) {
  Communicator& comm = mpi_world();
  // One machine: every rank shares memory with rank 0.
  EXPECT_EQ(comm.node_color(), 0);
}

}  // namespace
}  // namespace gradcomp
