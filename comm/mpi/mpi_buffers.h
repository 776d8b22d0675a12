// comm/mpi: the buffers MPI reads and writes, which the communicator owns (an abandoned collective may still write
// them, so they go to the graveyard with its request, comm/mpi/mpi_family.h): host vectors, and for a CUDA-aware MPI
// (comm/mpi/mpi_cuda_aware.h) blocks of device memory, filled and drained with copies on the caller's stream. Private
// to comm/mpi.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "gradcomp/communicator.h"

namespace gradcomp::mpi {

// Device blocks of one communicator's operation (grow-only, on the device of the last call's memory). Without CUDA in
// the build every call throws InvalidArgument (never reached: the communicator then takes host memory only).
class DeviceBlocks {
 public:
  DeviceBlocks();
  ~DeviceBlocks();
  DeviceBlocks(const DeviceBlocks&) = delete;
  DeviceBlocks& operator=(const DeviceBlocks&) = delete;

  // The send block, holding a copy of `send` (device memory in `memory`), and a receive block of `recv_bytes`, on
  // memory.device; the copy is complete on return.
  std::byte* send(std::span<const std::byte> send, Memory memory);
  std::byte* recv(std::size_t recv_bytes, Memory memory);
  // Copies `to.size()` bytes from `from` (one of the blocks) into `to` (device memory in `memory`) and waits for it.
  void copy_out(std::span<std::byte> to, const std::byte* from, Memory memory);

 private:
  struct Blocks;
  std::unique_ptr<Blocks> blocks_;
};

// memcpy of `bytes` bytes (none: nothing touched, null pointers allowed).
inline void copy_bytes(void* to, const void* from, std::size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

// What MPI reads and writes during one operation. Reused from call to call.
struct OpBuffers {
  std::vector<std::byte> send, recv, scratch;
  std::vector<int> counts, displs, recv_counts, recv_displs;
  DeviceBlocks device;
};

// Where one operation's MPI buffers are: b.send holding a copy of `send` and b.recv of `recv_bytes` bytes (host
// memory), or the device blocks (device memory).
struct Staged {
  std::byte* send;
  std::byte* recv;
};
Staged stage_in(OpBuffers& b, std::span<const std::byte> send, std::size_t recv_bytes, Memory memory);
// Copies `to.size()` bytes from `from` (a staged buffer) into `to`, in `memory`.
void copy_out(OpBuffers& b, std::span<std::byte> to, const std::byte* from, Memory memory);

}  // namespace gradcomp::mpi
