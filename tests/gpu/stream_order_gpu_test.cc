// The CUDA path across non-blocking streams: what one compress or decompress leaves queued on its stream is waited
// for by the next user of the same state or scratch on another stream, and by the host. Each test queues large work
// on one non-blocking stream and uses the result at once from another stream or from the host, so a missing wait
// shows as wrong bytes. Without a CUDA device the executable reports SKIPPED (exit 77).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"
#include "kernels/half_ops.cuh"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/parity_data.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;

class Streams : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    cudaStreamDestroy(a_);
    cudaStreamDestroy(b_);
  }
  cudaStream_t a_ = nullptr, b_ = nullptr;
};

// nonfinite=pass resets the non-finite residual entries after compress's only synchronization: save_state() right
// after must still see the reset (it waits for the tensor's mark), and equal the CPU's state.
TEST_F(Streams, PassResetIsVisibleToTheHost) {
  const std::size_t n = std::size_t{1} << 24;
  for (const std::string spec : {"fp16:nonfinite=pass", "topk:ratio=0.01,nonfinite=pass"}) {
    auto gpu = make_compressor(spec);
    auto cpu = make_compressor(spec);
    auto values = parity::random_values(n, 3);
    parity::put_nonfinite(values);
    for (std::size_t i = 8000; i < n; i += 4099) values[i] = std::nanf("");
    DeviceArray<float> device(values);
    DeviceArray<std::byte> out(gpu->max_payload_bytes(n));
    CompressContext ctx;
    ctx.name = "pass";
    gpu->compress(TensorView(device.data(), n, DType::kF32, Device::cuda(0), a_),
                  std::span<std::byte>(out.data(), out.size()), ctx);
    compress_to_vector(*cpu, TensorView::of(std::span<const float>(values)), ctx);
    EXPECT_EQ(gpu->save_state(), cpu->save_state()) << spec;
  }
}

// Two tensors of one compressor on two streams: stream A's decompress of a host payload (staged in the shared
// scratch) is still queued when stream B compresses an f16 tensor (the shared f16 scratch) and decompresses; both
// outputs must equal the CPU's.
TEST_F(Streams, SharedScratchIsOrderedAcrossStreams) {
  const std::size_t n = std::size_t{1} << 23;
  const std::string spec = "qsgd:bits=8";
  auto gpu = make_compressor(spec);
  auto cpu = make_compressor(spec);
  const auto values = parity::random_values(n, 4);
  CompressContext ctx;
  ctx.name = "x";
  const auto payload_x = compress_to_vector(*cpu, TensorView::of(std::span<const float>(values)), ctx);
  std::vector<float> expected_x(n);
  cpu->decompress(payload_x, TensorView::of(std::span<float>(expected_x)), DecodeMode::kOverwrite);

  std::vector<std::uint16_t> half(n);
  const auto small = parity::random_values(n, 5, 0.1f, parity::kHalfOutlier);
  for (std::size_t i = 0; i < n; ++i) half[i] = kernels::float_to_half_bits(small[i]);
  ctx.name = "y";
  std::vector<std::byte> payload_y(cpu->max_payload_bytes(n));
  payload_y.resize(cpu->compress(TensorView(half.data(), n, DType::kF16), payload_y, ctx));
  std::vector<std::uint16_t> expected_y(n);
  cpu->decompress(payload_y, TensorView(expected_y.data(), n, DType::kF16), DecodeMode::kOverwrite);

  DeviceArray<float> out_x(n);
  gpu->decompress(payload_x, TensorView(out_x.data(), n, DType::kF32, Device::cuda(0), a_), DecodeMode::kOverwrite);
  DeviceArray<std::uint16_t> grad_y(half);
  DeviceArray<std::byte> device_y(gpu->max_payload_bytes(n));
  const std::size_t size = gpu->compress(TensorView(grad_y.data(), n, DType::kF16, Device::cuda(0), b_),
                                         std::span<std::byte>(device_y.data(), device_y.size()), ctx);
  DeviceArray<std::uint16_t> out_y(n);
  gpu->decompress(PayloadBytes(std::span<const std::byte>(device_y.data(), size), Memory::on(Device::cuda(0), b_)),
                  TensorView(out_y.data(), n, DType::kF16, Device::cuda(0), b_), DecodeMode::kOverwrite);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  EXPECT_EQ(device_y.download(size), payload_y);
  EXPECT_TRUE(out_x.download() == expected_x);
  EXPECT_TRUE(out_y.download() == expected_y);
}

// One tensor compressed on stream A, then on stream B: B's compress reads the state A wrote (its mark orders B).
TEST_F(Streams, StateWrittenOnOneStreamIsReadOnAnother) {
  const std::size_t n = std::size_t{1} << 22;
  const std::string spec = "topk:ratio=0.05,nonfinite=pass";
  auto gpu = make_compressor(spec);
  auto cpu = make_compressor(spec);
  CompressContext ctx;
  ctx.name = "moved";
  for (std::uint64_t step = 0; step < 4; ++step) {
    ctx.step = step;
    auto values = parity::random_values(n, static_cast<unsigned>(10 + step));
    if (step == 1) parity::put_nonfinite(values);
    DeviceArray<float> device(values);
    DeviceArray<std::byte> out(gpu->max_payload_bytes(n));
    const std::size_t size = gpu->compress(TensorView(device.data(), n, DType::kF32, Device::cuda(0),
                                                      step % 2 ? b_ : a_),
                                           std::span<std::byte>(out.data(), out.size()), ctx);
    const auto expected = compress_to_vector(*cpu, TensorView::of(std::span<const float>(values)), ctx);
    ASSERT_EQ(out.download(size), expected) << "step " << step;
  }
  EXPECT_EQ(gpu->save_state(), cpu->save_state());
}

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
