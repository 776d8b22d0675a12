#include "comm/nccl/nccl_staging.h"

#include <cstring>

#include "kernels/cuda_check.h"

namespace gradcomp::comm {

namespace {
constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

NcclStaging::Device NcclStaging::stage(std::span<const std::byte> send, std::span<std::byte> recv, bool in_place,
                                       bool host, cudaStream_t stream) {
  host_recv_ = {};
  const bool send_host = host && !send.empty();
  const bool recv_host = host && !in_place && !recv.empty();
  const std::size_t send_room = send_host ? aligned(send.size()) : 0;
  recv_offset_ = in_place ? 0 : send_room;
  const std::size_t total = send_room + (recv_host ? recv.size() : 0);
  Device out{send.data(), recv.data()};
  if (total == 0) return out;
  // Grown by half again beyond the need, so a slowly growing message does not allocate on every call.
  if (device_.bytes() < total) device_.reserve(total + total / 2);
  if (host_.bytes() < total) host_.reserve(total + total / 2);
  if (send_host) {
    std::memcpy(host_.as<std::byte>(), send.data(), send.size());
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(device_.data(), host_.as<void>(), send.size(), cudaMemcpyHostToDevice, stream));
    out.send = device_.as<const std::byte>();
    if (in_place) {
      out.recv = device_.as<std::byte>();
      host_recv_ = recv;
    }
  }
  if (recv_host) {
    out.recv = device_.as<std::byte>() + recv_offset_;
    host_recv_ = recv;
  }
  return out;
}

void NcclStaging::copy_back_async(cudaStream_t stream) {
  if (host_recv_.empty()) return;
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host_.as<std::byte>() + recv_offset_, device_.as<std::byte>() + recv_offset_,
                                      host_recv_.size(), cudaMemcpyDeviceToHost, stream));
}

void NcclStaging::finish() {
  if (host_recv_.empty()) return;
  std::memcpy(host_recv_.data(), host_.as<std::byte>() + recv_offset_, host_recv_.size());
  host_recv_ = {};
}

}  // namespace gradcomp::comm
