// Shared by the LowRankOps GPU tests (lowrank_ops_gpu_test.cc: element operations and streams;
// lowrank_products_gpu_test.cc: gemm and orthonormalization): test data and the fixture holding a host and a
// CUDA LowRankOps on one non-blocking stream.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compressors/codecs/lowrank_ops.h"
#include "gradcomp/error.h"
#include "gradcomp/tensor.h"
#include "kernels/half_ops.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp::lowrank_test {

using testing::DeviceArray;

// Element counts: shorter than a warp, one block, a prime, and one that makes every grid-stride loop run at least
// twice per thread on an H200 (tests/gpu/parity_data.h: kGridStrideSize).
inline const std::vector<std::size_t> kSizes = {1, 7, 4096, 100003, 4'500'007};

// Deterministic, fast values in [-1, 1) (splitmix64).
inline std::vector<float> uniform_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> values(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : values) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
  return values;
}

inline float from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
inline std::uint32_t to_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Values with every special an operation may meet: NaN (quiet, negative with a payload), +-inf, -0, subnormals,
// values near f16's overflow and large ones.
inline std::vector<float> special_values(std::size_t n, std::uint64_t seed) {
  auto values = uniform_values(n, seed);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            from_bits(0xFFC01234u),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            0.0f,
                            1e-40f,
                            -3e-39f,
                            65519.0f,
                            -65520.0f,
                            3e38f,
                            1e5f};
  std::size_t s = 0;
  for (std::size_t i = seed % 7; i < n; i += 1013) values[i] = specials[s++ % std::size(specials)];
  return values;
}

inline bool is_nan_bits(std::uint16_t bits, DType dtype) {
  return dtype == DType::kF16 ? ((bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu) != 0)
                              : ((bits & 0x7F80u) == 0x7F80u && (bits & 0x007Fu) != 0);
}

// Bit-equal, or (when nan_is_nan) both NaN.
::testing::AssertionResult same_floats(const std::vector<float>& gpu, const std::vector<float>& cpu, bool nan_is_nan) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes " << gpu.size() << " vs " << cpu.size();
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (to_bits(gpu[i]) == to_bits(cpu[i])) continue;
    if (nan_is_nan && std::isnan(gpu[i]) && std::isnan(cpu[i])) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << gpu.size() << ": gpu " << gpu[i] << " (0x"
                                         << std::hex << to_bits(gpu[i]) << ") vs cpu " << cpu[i] << " (0x"
                                         << to_bits(cpu[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_halves(const std::vector<std::uint16_t>& gpu, const std::vector<std::uint16_t>& cpu,
                                       DType dtype, bool nan_is_nan) {
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] == cpu[i]) continue;
    if (nan_is_nan && is_nan_bits(gpu[i], dtype) && is_nan_bits(cpu[i], dtype)) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << gpu.size() << ": gpu 0x" << std::hex << gpu[i]
                                         << " vs cpu 0x" << cpu[i];
  }
  return ::testing::AssertionSuccess();
}

class LowRankOpsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    gpu_ = cuda_lowrank_ops(view_on_gpu(nullptr, 0, DType::kF32));
    cpu_ = host_lowrank_ops(1);
  }
  void TearDown() override {
    gpu_.reset();
    cudaStreamDestroy(stream_);
  }

  // After a DeviceArray's cudaMemcpy from pageable memory: that copy's DMA may still run when cudaMemcpy returns,
  // and work on a non-blocking stream does not wait for the legacy default stream.
  static void settle() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

  TensorView view_on_gpu(void* data, std::size_t n, DType dtype) const {
    return TensorView(data, n, dtype, Device::cuda(0), stream_);
  }
  FloatBuffer to_gpu(const std::vector<float>& host) {
    FloatBuffer buffer = gpu_->allocate(host.size());
    gpu_->upload(buffer.data(), host.data(), host.size());
    return buffer;
  }
  std::vector<float> to_host(const float* device, std::size_t n) {
    std::vector<float> host(n);
    gpu_->download(host.data(), device, n);
    return host;
  }
  std::vector<float> to_host(const FloatBuffer& buffer) { return to_host(buffer.data(), buffer.size()); }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LowRankOps> gpu_, cpu_;
};

}  // namespace gradcomp::lowrank_test
