// A communicator that takes CUDA device memory in every call by copying it through host memory around an inner
// communicator that cannot (the in-process backend, or MPI that is not CUDA-aware). It makes the device-resident
// path of compressed_allreduce and the Runtime testable with N ranks as threads on one GPU; on a real cluster use
// NCCL instead (it moves device memory itself).
#pragma once

#include <memory>

#include "gradcomp/communicator.h"

namespace gradcomp::comm {

// Wraps `inner` (not owned; must outlive the result). accepts_device_memory() is true; host memory passes through.
std::unique_ptr<Communicator> stage_device_memory(Communicator& inner);

}  // namespace gradcomp::comm
