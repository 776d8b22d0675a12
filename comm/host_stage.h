// Host staging of device buffers (for an MPI that is not CUDA-aware, and for the host codec path of the collectives):
// copy device memory to a host buffer, work on it, copy the result back. Without CUDA in the build, device tensors
// are rejected with InvalidArgument.
#pragma once

#include <cstddef>
#include <span>

#include "comm/algorithms/memory_space.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "gradcomp/tensor.h"

#if GRADCOMP_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#endif

namespace gradcomp::comm {

#if GRADCOMP_WITH_CUDA
// True when `pointer` is device (or managed) memory.
inline bool is_device_pointer(const void* pointer) {
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "invalid value" of a plain host pointer on old runtimes
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}
#endif

// A host copy of a device tensor, in a pooled host block (no allocation or zero-fill in steady state), copied on the
// tensor's stream (its producer's), which the caller's device must be current for (compressed_allreduce's
// DeviceScope). Synchronizes that stream before reading.
class HostStage {
 public:
  explicit HostStage(const TensorView& device_view) : device_(device_view), host_(device_view.bytes()) {
#if GRADCOMP_WITH_CUDA
    auto stream = static_cast<cudaStream_t>(device_.stream());
    GRADCOMP_CUDA_CHECK_IN(cudaMemcpyAsync(host_.data(), device_.data(), host_.size(), cudaMemcpyDeviceToHost, stream),
                           "host staging");
    kernels::synchronize_stream(stream);
#else
    throw InvalidArgument(fmt::format("{} is on a CUDA device but gradcomp was built without CUDA",
                                      device_.describe()));
#endif
  }
  TensorView host_view() { return TensorView(host_.data(), device_.numel(), device_.dtype()); }
  void copy_back() {
#if GRADCOMP_WITH_CUDA
    auto stream = static_cast<cudaStream_t>(device_.stream());
    GRADCOMP_CUDA_CHECK_IN(cudaMemcpyAsync(device_.data(), host_.data(), host_.size(), cudaMemcpyHostToDevice, stream),
                           "host staging");
    kernels::synchronize_stream(stream);
#endif
  }

 private:
  TensorView device_;
  algorithms::Bytes host_;
};

// Send/receive byte spans, staged through host memory when they are device memory and MPI is not CUDA-aware.
class SpanStage {
 public:
  SpanStage(std::span<const std::byte> send, std::span<std::byte> recv, bool cuda_aware)
      : send_(send), recv_(recv), user_recv_(recv) {
#if GRADCOMP_WITH_CUDA
    if (cuda_aware) return;
    if (is_device_pointer(send.data())) {
      send_host_ = algorithms::Bytes(send.size());
      GRADCOMP_CUDA_CHECK_IN(cudaMemcpy(send_host_.data(), send.data(), send.size(), cudaMemcpyDeviceToHost),
                             "host staging");
      send_ = std::span<const std::byte>(send_host_.data(), send.size());
    }
    if (is_device_pointer(recv.data())) {
      recv_host_ = algorithms::Bytes(recv.size());
      // In-place calls (broadcast) read the receive buffer too.
      GRADCOMP_CUDA_CHECK_IN(cudaMemcpy(recv_host_.data(), recv.data(), recv.size(), cudaMemcpyDeviceToHost),
                             "host staging");
      recv_ = std::span<std::byte>(recv_host_.data(), recv.size());
      staged_recv_ = true;
    }
#else
    (void)cuda_aware;
#endif
  }
  std::span<const std::byte> send() const { return send_; }
  std::span<std::byte> recv() const { return recv_; }
  void copy_back() {
#if GRADCOMP_WITH_CUDA
    if (staged_recv_) {
      GRADCOMP_CUDA_CHECK_IN(cudaMemcpy(user_recv_.data(), recv_host_.data(), recv_host_.size(), cudaMemcpyHostToDevice),
                             "host staging");
    }
#endif
  }

 private:
  std::span<const std::byte> send_;
  std::span<std::byte> recv_;
  std::span<std::byte> user_recv_;
  algorithms::Bytes send_host_{0}, recv_host_{0};  // pooled host blocks
#if GRADCOMP_WITH_CUDA
  bool staged_recv_ = false;  // only CUDA builds stage (clang's -Wunused-private-field otherwise)
#endif
};

}  // namespace gradcomp::comm
