// The CUDA memory space: device blocks from a per-thread cache, copies and kernels on the tensor's stream.
#include "gradcomp/config.h"

#include "comm/algorithms/memory_space.h"
#include "gradcomp/error.h"

#if GRADCOMP_WITH_CUDA
#include <algorithm>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/collective_cuda.h"
#include "kernels/common_cuda.h"
#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#endif

namespace gradcomp::algorithms {

#if GRADCOMP_WITH_CUDA
namespace {

// The calling thread's pool of device blocks (buffer_pool.h): no cudaMalloc on the hot path in steady state.
BlockPool& device_block_pool() {
  static constexpr BlockAllocator kDevice{
      [](std::size_t bytes, int device) {
        kernels::DeviceGuard guard(device);
        void* data = nullptr;
        GRADCOMP_CUDA_CHECK(cudaMalloc(&data, bytes));
        return static_cast<std::byte*>(data);
      },
      // Any current device frees it (unified addressing). No check: at thread or process exit the CUDA runtime may
      // already be unloading, and a failed free has no one to tell.
      [](std::byte* data, int) { (void)cudaFree(data); },
  };
  thread_local BlockPool pool(kDevice);
  return pool;
}

class CudaSpace final : public MemorySpace {
 public:
  explicit CudaSpace(const TensorView& tensor)
      : device_(tensor.device()), stream_(static_cast<cudaStream_t>(tensor.stream())), guard_(tensor.device().index) {}
  bool is_device() const override { return true; }
  Memory memory() const override { return Memory::on(device_, stream_); }
  TensorView view(void* data, std::size_t numel, DType dtype) const override {
    return TensorView(numel ? data : nullptr, numel, dtype, device_, stream_);
  }
  Bytes allocate(std::size_t bytes) override {
    return Bytes(device_block_pool, device_block_pool().acquire(bytes, device_.index), bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_zero(void* dst, std::size_t bytes) override {
    if (bytes) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void read(void* host, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void load_f32(const TensorView& in, float* out) override {
    const std::size_t n = in.numel();
    if (n == 0) return;
    switch (in.dtype()) {
      case DType::kF32: copy(out, in.data(), n * sizeof(float)); return;
      case DType::kF16:
      case DType::kBF16:
        kernels::launch_half_to_float(static_cast<const std::uint16_t*>(in.data()), out, n,
                                      in.dtype() == DType::kBF16, stream_);
        return;
      default: throw InvalidArgument(fmt::format("compressed_allreduce: cannot read {}", in.describe()));
    }
  }
  void store_f32(const float* values, const TensorView& out) override {
    const std::size_t n = out.numel();
    if (n == 0) return;
    switch (out.dtype()) {
      case DType::kF32:
        if (out.data() != values) copy(out.data(), values, n * sizeof(float));
        return;
      case DType::kF16:
      case DType::kBF16:
        kernels::launch_float_to_half(values, static_cast<std::uint16_t*>(out.data()), n,
                                      out.dtype() == DType::kBF16, stream_);
        return;
      default: throw InvalidArgument(fmt::format("compressed_allreduce: cannot store into {}", out.describe()));
    }
  }
  std::size_t divide(float* values, std::size_t n, float divisor, bool count_nonzero) override {
    if (!count_nonzero) {
      kernels::launch_divide_count(values, n, divisor, nullptr, stream_);
      return 0;
    }
    // The counter is a pooled block (a small size class): no cudaMalloc per call in steady state.
    Bytes counter_bytes = allocate(sizeof(unsigned long long));
    auto* counter = reinterpret_cast<unsigned long long*>(counter_bytes.data());
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), stream_));
    kernels::launch_divide_count(values, n, divisor, counter, stream_);
    unsigned long long count = 0;
    read(&count, counter, sizeof(count));
    return static_cast<std::size_t>(count);
  }
  void add(float* acc, const float* x, std::size_t n) override { kernels::launch_add(acc, x, n, stream_); }
  void synchronize() override { kernels::synchronize_stream(stream_); }

 private:
  Device device_;
  cudaStream_t stream_;
  kernels::DeviceGuard guard_;
};

}  // namespace

std::unique_ptr<MemorySpace> cuda_space(const TensorView& tensor) { return std::make_unique<CudaSpace>(tensor); }
#else
std::unique_ptr<MemorySpace> cuda_space(const TensorView& tensor) {
  throw InvalidArgument(fmt::format("{} is on a CUDA device but gradcomp was built without CUDA", tensor.describe()));
}
#endif

}  // namespace gradcomp::algorithms
