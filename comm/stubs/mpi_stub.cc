// Builds without MPI: the factory reports what is missing instead of failing at link time.
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "gradcomp/mailbox.h"

namespace gradcomp {

std::unique_ptr<Communicator> make_mpi_world_communicator(const MpiOptions&) {
  throw CommError("make_mpi_world_communicator: gradcomp was built without MPI (configure with -DGRADCOMP_WITH_MPI=ON "
                  "and an MPI installation)");
}

std::string mpi_thread_level() { return "none"; }

std::unique_ptr<Mailbox> make_mpi_world_mailbox(std::chrono::milliseconds) {
  throw CommError("make_mpi_world_mailbox: gradcomp was built without MPI (configure with -DGRADCOMP_WITH_MPI=ON and "
                  "an MPI installation)");
}

}  // namespace gradcomp
