// Builds without NCCL: the factory reports what is missing instead of failing at link time.
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"

namespace gradcomp {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index) {
  throw CommError(fmt::format("make_nccl_communicator (rank {}, device {}): gradcomp was built without NCCL "
                              "(configure with -DGRADCOMP_WITH_CUDA=ON -DGRADCOMP_WITH_NCCL=ON)",
                              bootstrap.rank(), device_index));
}

}  // namespace gradcomp
