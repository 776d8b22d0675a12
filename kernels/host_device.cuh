// GRADCOMP_HOST_DEVICE marks per-element math shared by the CPU loops and the CUDA kernels: one truth for both.
#pragma once

#if defined(__CUDACC__)
#define GRADCOMP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GRADCOMP_HOST_DEVICE inline
#endif
