// comm/mpi: whether the MPI communicator takes CUDA device memory (a CUDA-aware MPI), decided once per process from
// the build, the MPI library and GRADCOMP_MPI_CUDA_AWARE. Private to comm/mpi.
#pragma once

#include <optional>
#include <string>

namespace gradcomp::mpi {

// What the decision reads.
struct CudaAwareFacts {
  bool gradcomp_has_cuda = false;       // GRADCOMP_WITH_CUDA: without it there is no device memory to take
  bool mpi_built_with_cuda = false;     // Open MPI's MPIX_CUDA_AWARE_SUPPORT (<mpi-ext.h>); false for other MPIs
  bool mpi_runtime_cuda = false;        // MPIX_Query_cuda_support(): the library loaded at run time has it on
  std::optional<std::string> override;  // GRADCOMP_MPI_CUDA_AWARE: "0" or "1"; unset or empty: detect
};

// True when the communicator takes CUDA memory: never in a build without CUDA; "0" never; "1" always (an MPI whose
// support the query cannot see: MPICH, MVAPICH2-GDR, an Open MPI built without the extension); otherwise when Open
// MPI was built CUDA-aware and reports it at run time. Throws InvalidArgument naming GRADCOMP_MPI_CUDA_AWARE for
// another value.
bool decide_cuda_aware(const CudaAwareFacts& facts);

// This process's facts (MPI initialized), decided on the first call; every communicator of the process shares it.
bool cuda_aware();

}  // namespace gradcomp::mpi
