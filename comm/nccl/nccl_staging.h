// Host byte spans through device memory for the NCCL communicator (NCCL moves device memory only): one device block
// and one page-locked host block per communicator, grown to the largest call and then reused, so a steady state
// allocates nothing (the negotiation's and the algorithms' small host messages: payload sizes, agreement
// fingerprints). Copies run on the communicator's stream, in order with its collectives. Not thread-safe (one thread
// drives a communicator).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "kernels/cuda_buffer.h"

namespace gradcomp::comm {

class NcclStaging {
 public:
  // Where a collective reads and writes: the spans themselves when they are device memory, else places in the
  // staging blocks (the same place for both when `in_place`). The caller says which (Memory): nothing is probed.
  struct Device {
    const std::byte* send = nullptr;
    std::byte* recv = nullptr;
  };
  // Prepares one call whose spans are host memory when `host` (else device memory, passed through): a host `send`
  // is copied into the staging block and enqueued to the device on `stream`.
  Device stage(std::span<const std::byte> send, std::span<std::byte> recv, bool in_place, bool host,
               cudaStream_t stream);
  // After the collective was enqueued on `stream`: enqueues the copy of a host `recv` back to page-locked memory.
  void copy_back_async(cudaStream_t stream);
  // Once the stream has passed copy_back_async(): copies the result into the host `recv`.
  void finish();

 private:
  kernels::DeviceBuffer device_;
  kernels::PinnedBuffer host_;
  std::span<std::byte> host_recv_;   // the caller's host receive span of this call (empty: none)
  std::size_t recv_offset_ = 0;      // where the received bytes are in both blocks
};

}  // namespace gradcomp::comm
