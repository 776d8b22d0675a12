// Per-thread CUDA resources of the low-rank ops on the device (compressors/cuda/lowrank_ops_cuda.cc): one cuBLAS handle
// per device and one scratch block per (device, stream), kept until the thread exits; the cuBLAS status check; a
// device switch that never throws (for destructors). CUDA builds only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "kernels/cuda_check.h"
#include "kernels/lowrank_cuda.h"
#include "kernels/usage_counters.h"

namespace gradcomp::lowrank_cuda {

// cuBLAS's workspace per stream (its guide asks for up to 32 MiB on Hopper for the largest products; PowerSGD's
// products have one small dimension, the rank).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{8} << 20;

inline void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    throw CudaError(fmt::format("cuda_lowrank_ops: {} failed: {} ({})", call, cublasGetStatusName(status),
                                cublasGetStatusString(status)));
  }
}
#define GRADCOMP_CUBLAS_CHECK(expr) ::gradcomp::lowrank_cuda::check_cublas((expr), #expr)

// The scratch block of one (device, stream): [cuBLAS workspace | Gram-Schmidt workspace | NaN/Inf result].
struct ScratchLayout {
  std::size_t ortho_offset = kCublasWorkspaceBytes;
  std::size_t nonfinite_offset = kCublasWorkspaceBytes + kernels::orthonormalize_workspace_bytes();
  std::size_t bytes = nonfinite_offset + kernels::kNonfiniteResultBytes;
};

struct Scratch {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::byte* data = nullptr;
  unsigned long long* counts = nullptr;  // batched non-finite results: 2 per slot (count, first index)
  std::size_t count_slots = 0;
};

// Makes `device` current and restores the previous one, without throwing (for destructors).
class QuietDeviceSwitch {
 public:
  explicit QuietDeviceSwitch(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();  // clear only the error this call caused
    } else if (previous_ != device) {
      switched_ = cudaSetDevice(device) == cudaSuccess;
      if (!switched_) (void)cudaGetLastError();
    }
  }
  ~QuietDeviceSwitch() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  QuietDeviceSwitch(const QuietDeviceSwitch&) = delete;
  QuietDeviceSwitch& operator=(const QuietDeviceSwitch&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// This thread's cuBLAS handles and scratch blocks. Freed when the thread exits (cudaFree waits for the device's
// queued work, so work still running on a block finishes first).
class ThreadResources {
 public:
  ThreadResources() = default;
  ThreadResources(const ThreadResources&) = delete;
  ThreadResources& operator=(const ThreadResources&) = delete;
  ~ThreadResources() {
    for (const auto& [device, handle] : handles_) {
      const QuietDeviceSwitch on(device);
      (void)cublasDestroy(handle);
    }
    for (const Scratch& scratch : scratch_) {
      const QuietDeviceSwitch on(scratch.device);
      if (cudaFree(scratch.data) != cudaSuccess) (void)cudaGetLastError();
      if (scratch.counts != nullptr && cudaFree(scratch.counts) != cudaSuccess) (void)cudaGetLastError();
    }
  }

  // The handle of `device` (the current device).
  cublasHandle_t handle(int device) {
    for (const auto& [d, h] : handles_) {
      if (d == device) return h;
    }
    cublasHandle_t handle = nullptr;
    GRADCOMP_CUBLAS_CHECK(cublasCreate(&handle));
    handles_.emplace_back(device, handle);
    // Plain IEEE single precision (no TF32, no emulation) so products agree with the host BLAS within float
    // rounding; no atomics, so a product gives the same bits on every run.
    GRADCOMP_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    GRADCOMP_CUBLAS_CHECK(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
    GRADCOMP_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    return handle;
  }

  // The scratch block of (`device`, `stream`) (the device current), ScratchLayout().bytes bytes.
  std::byte* scratch(int device, cudaStream_t stream) { return entry(device, stream).data; }

  // The batched non-finite results of (`device`, `stream`): at least `slots` slots, grown (old results lost) when
  // needed; the previous block is freed after the stream's queued work (cudaFree waits for the device).
  unsigned long long* counts(int device, cudaStream_t stream, std::size_t slots) {
    Scratch& s = entry(device, stream);
    if (s.count_slots < slots) {
      if (s.counts != nullptr) GRADCOMP_CUDA_CHECK(cudaFree(s.counts));
      s.counts = nullptr;
      s.count_slots = 0;
      void* data = nullptr;
      GRADCOMP_CUDA_CHECK(cudaMalloc(&data, slots * kernels::kNonfiniteResultBytes));
      kernels::note_allocation();
      s.counts = static_cast<unsigned long long*>(data);
      s.count_slots = slots;
    }
    return s.counts;
  }

 private:
  Scratch& entry(int device, cudaStream_t stream) {
    for (Scratch& s : scratch_) {
      if (s.device == device && s.stream == stream) return s;
    }
    void* data = nullptr;
    GRADCOMP_CUDA_CHECK(cudaMalloc(&data, ScratchLayout().bytes));
    kernels::note_allocation();
    scratch_.push_back(Scratch{device, stream, static_cast<std::byte*>(data)});
    return scratch_.back();
  }

  std::vector<std::pair<int, cublasHandle_t>> handles_;
  std::vector<Scratch> scratch_;
};

inline ThreadResources& thread_resources() {
  thread_local ThreadResources resources;
  return resources;
}

}  // namespace gradcomp::lowrank_cuda
