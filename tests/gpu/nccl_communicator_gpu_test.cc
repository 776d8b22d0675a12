// The NCCL communicator on one rank (one GPU, bootstrapped by a one-rank in-process communicator): every call
// completes with the right bytes from device and host memory, on the communicator's stream and on a non-blocking
// user stream, split works on a non-blocking parent, and destruction (finalize, poll, destroy) returns. One rank
// cannot show cross-rank traffic, but it runs every non-blocking code path: the enqueue poll, the stream wait, the
// split poll and the finalize poll. Without a CUDA device the executable reports SKIPPED (exit 77).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "gradcomp/communicator.h"
#include "kernels/half_ops.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    bootstrap_ = std::move(make_local_communicators(1, std::chrono::seconds(60))[0]);
    nccl_ = make_nccl_communicator(*bootstrap_, 0);
  }

  std::unique_ptr<Communicator> bootstrap_, nccl_;
};

TEST_F(NcclOneRank, Identity) {
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->size(), 1);
  EXPECT_EQ(nccl_->backend(), "nccl");
}

// A large device allreduce on a non-blocking user stream: allreduce() must not return before the stream ran it
// (a non-blocking communicator may return from the call before the work is even enqueued, and an empty stream then
// looks finished). A sum over one rank is the identity, an average divides by 1.
TEST_F(NcclOneRank, DeviceAllreduceOnAUserStreamCompletes) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const std::size_t n = std::size_t{1} << 24;
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 1000) - 500.0f;
  DeviceArray<float> device(values);
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
    nccl_->allreduce(TensorView(device.data(), n, DType::kF32, Device::cuda(0), stream), op);
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess) << "allreduce returned before its stream finished";
    ASSERT_EQ(device.download(), values);
  }
  std::vector<std::uint16_t> half(4099, kernels::float_to_half_bits(0.75f));
  DeviceArray<std::uint16_t> device_half(half);
  nccl_->allreduce(TensorView(device_half.data(), half.size(), DType::kF16, Device::cuda(0), stream), ReduceOp::kSum);
  EXPECT_EQ(device_half.download(), half);
  cudaStreamDestroy(stream);
}

TEST_F(NcclOneRank, HostAllreduceIsStaged) {
  std::vector<std::int32_t> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int32_t>(i) * 3 - 7;
  auto inout = values;
  nccl_->allreduce(TensorView(inout.data(), inout.size(), DType::kI32), ReduceOp::kSum);
  EXPECT_EQ(inout, values);
  nccl_->barrier();
}

std::vector<std::byte> pattern(std::size_t n, unsigned salt) {
  std::vector<std::byte> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>((i * 131 + salt) & 0xFF);
  return bytes;
}

TEST_F(NcclOneRank, ByteCallsFromHostMemory) {
  const auto send = pattern(100003, 1);
  std::vector<std::byte> recv(send.size());
  nccl_->allgather(send, recv);
  EXPECT_EQ(recv, send);
  const std::vector<std::size_t> counts = {send.size()};
  std::vector<std::byte> recv_v(send.size());
  nccl_->allgatherv(send, counts, recv_v);
  EXPECT_EQ(recv_v, send);
  std::vector<std::byte> recv_a(send.size());
  nccl_->alltoallv(send, counts, recv_a, counts);
  EXPECT_EQ(recv_a, send);
  auto buffer = pattern(4097, 9);
  const auto expected = buffer;
  nccl_->broadcast(buffer, 0);
  EXPECT_EQ(buffer, expected);
}

TEST_F(NcclOneRank, ByteCallsFromDeviceMemory) {
  const auto host = pattern(65537, 5);
  DeviceArray<std::byte> send(host);
  DeviceArray<std::byte> recv(host.size());
  const Memory device = Memory::on(Device::cuda(0), nullptr);  // the caller says where the bytes live
  nccl_->allgather({send.data(), host.size()}, {recv.data(), host.size()}, device);
  EXPECT_EQ(recv.download(), host);
  DeviceArray<std::byte> recv_v(host.size());
  const std::vector<std::size_t> counts = {host.size()};
  nccl_->allgatherv({send.data(), host.size()}, counts, {recv_v.data(), host.size()}, device);
  EXPECT_EQ(recv_v.download(), host);
  DeviceArray<std::byte> recv_a(host.size());
  nccl_->alltoallv({send.data(), host.size()}, counts, {recv_a.data(), host.size()}, counts, device);
  EXPECT_EQ(recv_a.download(), host);
  nccl_->broadcast({recv_a.data(), host.size()}, 0, device);
  EXPECT_EQ(recv_a.download(), host);
}

// ncclCommSplit on a non-blocking parent: the child works, a rank with a negative color gets none, and the parent
// still works after both.
TEST_F(NcclOneRank, SplitOnANonBlockingParent) {
  auto child = nccl_->split(0, 0);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->size(), 1);
  std::vector<float> values(777, 2.5f);
  auto inout = values;
  child->allreduce(TensorView(inout.data(), inout.size(), DType::kF32), ReduceOp::kSum);
  EXPECT_EQ(inout, values);
  child.reset();  // finalize + destroy of the child
  EXPECT_EQ(nccl_->split(-1, 0), nullptr);
  nccl_->barrier();
}

// Destruction finalizes and destroys within the timeout, also right after queued work.
TEST_F(NcclOneRank, DestroyAfterWorkReturns) {
  std::vector<float> values(1 << 20, 1.0f);
  DeviceArray<float> device(values);
  nccl_->allreduce(TensorView(device.data(), values.size(), DType::kF32, Device::cuda(0)), ReduceOp::kSum);
  const auto start = std::chrono::steady_clock::now();
  nccl_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
