// A gradcomp::Communicator over a torch.distributed process group (gloo, or NCCL where present), so the DDP hook and
// the optimizer's torch backend run the same C++ algorithms (comm/algorithms) as the MPI backend. Every operation
// takes the GIL and calls a Python adapter (gradcomp.torch.exchange.ProcessGroupAdapter) with zero-copy torch views of
// the C++ memory (on the memory's device; a device call also passes its stream); torch releases the GIL while a
// collective waits on the network. On NCCL it takes the group's CUDA device, so a CUDA bucket stays on the GPU.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "gradcomp/communicator.h"

namespace gradcomp::python {

namespace nb = nanobind;

class TorchCommunicator final : public Communicator {
 public:
  // `adapter`: a ProcessGroupAdapter (rank, size, backend, timeout_s attributes; `device`: None, or the torch.device
  // of CUDA memory its group takes; one method per collective, each taking a `stream` keyword for device buffers).
  // The timeout starts as the process group's own. Needs the GIL.
  explicit TorchCommunicator(nb::object adapter);
  // Takes the GIL to release the adapter.
  ~TorchCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "torch:gloo" or "torch:nccl".
  std::string backend() const override { return backend_; }
  // Host memory, and the adapter's CUDA device (torch on NCCL).
  bool takes(Device device) const override { return device.is_cpu() || (device_ && device == *device_); }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  // f16/bf16 sums on gloo are summed in f32 and rounded once (the adapter's split sum): identical on every rank.
  void allreduce(const TensorView& inout, ReduceOp op) override;
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) override;
  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv, Memory memory) override;
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                 std::span<const std::size_t> recv_counts, Memory memory) override;
  void broadcast(std::span<std::byte> buffer, int root, Memory memory) override;
  void barrier() override;
  // torch creates groups collectively over the whole job and orders their ranks by global rank: the split works on a
  // communicator that spans every process, with keys that keep the ranks' order (make_node_groups' do); otherwise
  // CommError.
  std::unique_ptr<Communicator> split(int color, int key) override;

  // The adapter (for Python callers that issue collectives on the same group).
  nb::object adapter() const { return adapter_; }

 private:
  // Calls adapter.<method>(args..., timeout_s) with the GIL held, turning a Python exception into gradcomp's
  // (Timeout for TimeoutError, InvalidArgument for ValueError, CommError otherwise) with this rank in the message.
  template <typename... Args>
  nb::object call(const char* method, Memory memory, Args&&... args);

  nb::object adapter_;
  int rank_ = 0;
  int size_ = 1;
  std::string backend_;
  std::optional<Device> device_;  // the CUDA device the group takes (NCCL)
  std::chrono::milliseconds timeout_;
};

}  // namespace gradcomp::python
