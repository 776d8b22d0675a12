// The one place that stages: a host copy of device memory, for a communicator that does not take the device. Callers
// use with_memory_taken() (gradcomp/communicator.h); tests/comm/through_host.h wraps a whole communicator with it.
// Without CUDA in the build, device memory is rejected with InvalidArgument.
#pragma once

#include <cstddef>
#include <span>

#include "comm/algorithms/memory_space.h"
#include "gradcomp/communicator.h"
#include "gradcomp/tensor.h"

namespace gradcomp::comm {

// `bytes` bytes of device memory at `device_data` (in `memory`: its device and stream, which the calling thread's
// current device must match) copied into a pooled host block (no allocation or zero-fill in steady state). The copies
// run on memory.stream, which is synchronized before the host block is read and after copy_back().
class HostCopy {
 public:
  // `copy_in`: false for a buffer that is only written (a receive buffer): the host block starts uninitialized.
  HostCopy(void* device_data, std::size_t bytes, Memory memory, bool copy_in = true);
  // A copy of a device tensor's elements.
  explicit HostCopy(const TensorView& device_view)
      : HostCopy(device_view.data(), device_view.bytes(), Memory::of(device_view)) {
    view_ = device_view;
  }
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;

  std::span<std::byte> host() { return {host_.data(), bytes_}; }
  // The host copy as a tensor (the device view's numel and dtype; constructed from a TensorView only).
  TensorView host_view() const {
    return TensorView(host_.data(), view_.numel(), view_.dtype()).with_rows(view_.rows());
  }
  // Copies the host block back over the device memory and waits for it.
  void copy_back();

 private:
  [[maybe_unused]] void* device_data_;  // unused without CUDA
  std::size_t bytes_;
  [[maybe_unused]] Memory memory_;
  algorithms::Bytes host_;
  TensorView view_;
};

}  // namespace gradcomp::comm
