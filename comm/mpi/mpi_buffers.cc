#include "comm/mpi/mpi_buffers.h"

#include <fmt/format.h>

#include "gradcomp/config.h"
#include "gradcomp/error.h"

#if GRADCOMP_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#endif

namespace gradcomp::mpi {

#if GRADCOMP_WITH_CUDA
struct DeviceBlocks::Blocks {
  kernels::DeviceBuffer send, recv;
  Device device = Device::cpu();

  // The blocks live on `device`: blocks of another device are dropped first.
  void on(Device want) {
    if (device == want) return;
    send.release();
    recv.release();
    device = want;
  }
};

namespace {
void copy_on_stream(void* to, const void* from, std::size_t bytes, Memory memory) {
  if (bytes == 0) return;
  auto stream = static_cast<cudaStream_t>(memory.stream);
  GRADCOMP_CUDA_CHECK_IN(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream), "mpi device blocks");
  kernels::synchronize_stream(stream);
}
}  // namespace

DeviceBlocks::DeviceBlocks() : blocks_(std::make_unique<Blocks>()) {}
DeviceBlocks::~DeviceBlocks() = default;

std::byte* DeviceBlocks::send(std::span<const std::byte> send, Memory memory) {
  DeviceScope scope(memory.device);
  blocks_->on(memory.device);
  auto* block = static_cast<std::byte*>(blocks_->send.reserve(send.size() == 0 ? 1 : send.size()));
  copy_on_stream(block, send.data(), send.size(), memory);
  return block;
}

std::byte* DeviceBlocks::recv(std::size_t recv_bytes, Memory memory) {
  DeviceScope scope(memory.device);
  blocks_->on(memory.device);
  return static_cast<std::byte*>(blocks_->recv.reserve(recv_bytes == 0 ? 1 : recv_bytes));
}

void DeviceBlocks::copy_out(std::span<std::byte> to, const std::byte* from, Memory memory) {
  DeviceScope scope(memory.device);
  copy_on_stream(to.data(), from, to.size(), memory);
}
#else
struct DeviceBlocks::Blocks {};

namespace {
[[noreturn]] void no_cuda(Memory memory) {
  throw InvalidArgument(fmt::format("mpi communicator: buffers on {}, but gradcomp was built without CUDA",
                                    device_name(memory.device)));
}
}  // namespace

DeviceBlocks::DeviceBlocks() = default;
DeviceBlocks::~DeviceBlocks() = default;
std::byte* DeviceBlocks::send(std::span<const std::byte>, Memory memory) { no_cuda(memory); }
std::byte* DeviceBlocks::recv(std::size_t, Memory memory) { no_cuda(memory); }
void DeviceBlocks::copy_out(std::span<std::byte>, const std::byte*, Memory memory) { no_cuda(memory); }
#endif

Staged stage_in(OpBuffers& b, std::span<const std::byte> send, std::size_t recv_bytes, Memory memory) {
  if (!memory.is_host()) return {b.device.send(send, memory), b.device.recv(recv_bytes, memory)};
  b.send.resize(send.size());
  copy_bytes(b.send.data(), send.data(), send.size());
  b.recv.resize(recv_bytes);
  return {b.send.data(), b.recv.data()};
}

void copy_out(OpBuffers& b, std::span<std::byte> to, const std::byte* from, Memory memory) {
  if (!memory.is_host()) {
    b.device.copy_out(to, from, memory);
  } else {
    copy_bytes(to.data(), from, to.size());
  }
}

}  // namespace gradcomp::mpi
