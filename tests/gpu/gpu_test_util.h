// Helpers of the gpu-labelled tests: device arrays, and a main() that reports "no CUDA device" as SKIPPED (exit
// code 77, CTest's SKIP_RETURN_CODE) instead of passing.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda_check.h"
#include "kernels/cuda_device.h"

namespace gradcomp::testing {

// A device copy of a host vector (or uninitialized device memory), freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) : count_(count) {
    GRADCOMP_CUDA_CHECK(cudaMalloc(&data_, (count ? count : 1) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void upload(const std::vector<T>& host) {
    GRADCOMP_CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(std::size_t count) const {
    std::vector<T> host(count);
    GRADCOMP_CUDA_CHECK(cudaMemcpy(host.data(), data_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  std::vector<T> download() const { return download(count_); }
  // Copies in the order of `stream`, waiting for them: a plain cudaMemcpy runs on the legacy default stream, which a
  // non-blocking stream does not wait for (and from pageable memory it may return before its DMA is done).
  void upload(const std::vector<T>& host, cudaStream_t stream) {
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<T> download(cudaStream_t stream) const {
    std::vector<T> host(count_);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost, stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
  }
  T* data() const { return static_cast<T*>(data_); }
  std::size_t size() const { return count_; }

 private:
  void* data_ = nullptr;
  std::size_t count_ = 0;
};

// main() of a gpu test: exit 77 (skipped) with the reason when no CUDA device is usable, else run every test.
inline int run_gpu_tests(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("SKIPPED: %s\n", cuda_unavailable_reason().c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace gradcomp::testing

#define GRADCOMP_GPU_TEST_MAIN() \
  int main(int argc, char** argv) { return ::gradcomp::testing::run_gpu_tests(argc, argv); }
