// Error checking for CUDA runtime calls and kernel launches (host code of CUDA builds only). Both macros turn a
// failing cudaError_t into gradcomp::CudaError whose message names the call, the file and line, and CUDA's own
// name and description of the code. This header includes no fmt, so .cu translation units may use it.
#pragma once

#include <cuda_runtime_api.h>

namespace gradcomp::detail {
// Throws gradcomp::CudaError; defined in kernels/cuda_errors.cc. `context` (may be null) is appended in parentheses,
// e.g. "nccl communicator rank 3".
[[noreturn]] void throw_cuda_error(int code, const char* name, const char* description, const char* expression,
                                   const char* file, int line, const char* context = nullptr);
}  // namespace gradcomp::detail

// Evaluates a CUDA runtime call once; throws gradcomp::CudaError (with file/line and the call's text) unless it
// returned cudaSuccess.
#define GRADCOMP_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                         \
    const cudaError_t gradcomp_cuda_status_ = (expr);                                                          \
    if (gradcomp_cuda_status_ != cudaSuccess) [[unlikely]] {                                                   \
      ::gradcomp::detail::throw_cuda_error(static_cast<int>(gradcomp_cuda_status_),                            \
                                           cudaGetErrorName(gradcomp_cuda_status_),                            \
                                           cudaGetErrorString(gradcomp_cuda_status_), #expr, __FILE__, __LINE__); \
    }                                                                                                          \
  } while (0)

// GRADCOMP_CUDA_CHECK with a context string (a const char*, evaluated only on failure) naming who failed, e.g. the
// communicator and rank: the one check every CUDA call site uses (kernels, codecs, staging, NCCL).
#define GRADCOMP_CUDA_CHECK_IN(expr, context)                                                                  \
  do {                                                                                                         \
    const cudaError_t gradcomp_cuda_status_ = (expr);                                                          \
    if (gradcomp_cuda_status_ != cudaSuccess) [[unlikely]] {                                                   \
      ::gradcomp::detail::throw_cuda_error(static_cast<int>(gradcomp_cuda_status_),                            \
                                           cudaGetErrorName(gradcomp_cuda_status_),                            \
                                           cudaGetErrorString(gradcomp_cuda_status_), #expr, __FILE__, __LINE__, \
                                           (context));                                                         \
    }                                                                                                          \
  } while (0)

// Put after every kernel launch: reports launch-configuration errors (and earlier asynchronous faults) without
// clearing them or synchronizing.
#define GRADCOMP_CUDA_LAUNCH_CHECK() GRADCOMP_CUDA_CHECK(cudaPeekAtLastError())
