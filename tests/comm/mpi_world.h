// The MPI world communicator shared by the tests of one mpirun process (created on first use, 30 s timeout).
#pragma once

#include <memory>

#include "gradcomp/communicator.h"

namespace gradcomp::testing {

inline Communicator& mpi_world() {
  static std::unique_ptr<Communicator> world = [] {
    MpiOptions options;
    options.timeout = std::chrono::seconds(30);
    return make_mpi_world_communicator(options);
  }();
  return *world;
}

}  // namespace gradcomp::testing
