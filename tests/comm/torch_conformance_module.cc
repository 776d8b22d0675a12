// The conformance suite (tests/comm/communicator_conformance.h) as a Python module, so that it runs over a
// TorchCommunicator (gradcomp's Communicator over a torch.distributed group) inside the processes of a torch job, as
// it runs over comm/local and comm/mpi: tests/python/test_torch_conformance.py.
#include <gtest/gtest.h>
#include <nanobind/nanobind.h>

#include "tests/comm/communicator_conformance.h"

namespace {

gradcomp::Communicator* g_comm = nullptr;  // the communicator of the current run()

TEST(TorchCommunicator, ConformanceAllreduce) { gradcomp::testing::conformance_allreduce(*g_comm); }
TEST(TorchCommunicator, ConformanceCollectives) { gradcomp::testing::conformance_collectives(*g_comm); }
TEST(TorchCommunicator, ConformanceAlltoall) { gradcomp::testing::conformance_alltoall(*g_comm); }
TEST(TorchCommunicator, ConformanceSplit) { gradcomp::testing::conformance_split(*g_comm); }
TEST(TorchCommunicator, ConformanceMemory) { gradcomp::testing::conformance_memory(*g_comm); }

}  // namespace

NB_MODULE(_gradcomp_conformance, m) {
  // Runs the suite's cases on `comm` (collective: every rank calls it) and returns GoogleTest's exit code (0: all
  // passed). The GIL is released: the communicator's calls take it themselves.
  m.def("run", [](gradcomp::Communicator& comm) {
    g_comm = &comm;
    int argc = 1;
    char name[] = "conformance";
    char* argv[] = {name, nullptr};
    ::testing::InitGoogleTest(&argc, argv);
    nanobind::gil_scoped_release release;
    const int rc = RUN_ALL_TESTS();
    g_comm = nullptr;
    return rc;
  });
}
