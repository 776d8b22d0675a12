// A test double: a communicator that takes CUDA device memory in every call by copying it through host memory
// (comm/host_copy.h) around an inner communicator that takes host memory only (the in-process backend, MPI). It lets
// the device-resident path of compressed_allreduce and the Runtime run with N ranks as threads on one GPU; on a
// cluster NCCL moves device memory itself.
#pragma once

#include <memory>
#include <optional>

#include "comm/host_copy.h"
#include "gradcomp/communicator.h"

namespace gradcomp::testing {

class ThroughHost final : public Communicator {
 public:
  explicit ThroughHost(Communicator& inner) : inner_(inner) {}
  // A split's child owns its inner communicator.
  explicit ThroughHost(std::unique_ptr<Communicator> owned) : owned_(std::move(owned)), inner_(*owned_) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend() + "+through-host"; }
  bool takes(Device) const override { return true; }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void set_timeout(std::chrono::milliseconds timeout) override { inner_.set_timeout(timeout); }
  int node_color() override { return inner_.node_color(); }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    if (inout.device().is_cpu()) return inner_.allreduce(inout, op);
    comm::HostCopy stage(inout);
    inner_.allreduce(stage.host_view(), op);
    stage.copy_back();
  }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) override {
    Staged s(send, recv, memory, false);
    inner_.allgather(s.send(), s.recv());
    s.finish();
  }
  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv, Memory memory) override {
    Staged s(send, recv, memory, false);
    inner_.allgatherv(s.send(), recv_counts, s.recv());
    s.finish();
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                 std::span<const std::size_t> recv_counts, Memory memory) override {
    Staged s(send, recv, memory, false);
    inner_.alltoallv(s.send(), send_counts, s.recv(), recv_counts);
    s.finish();
  }
  void broadcast(std::span<std::byte> buffer, int root, Memory memory) override {
    Staged s({}, buffer, memory, /*recv_is_read=*/true);
    inner_.broadcast(s.recv(), root);
    s.finish();
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    auto child = inner_.split(color, key);
    if (!child) return nullptr;
    return std::make_unique<ThroughHost>(std::move(child));
  }

 private:
  // One call's spans in host memory: themselves on the host, else host copies (the receive buffer copied in only
  // when the call reads it, as broadcast does).
  class Staged {
   public:
    Staged(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory, bool recv_is_read)
        : send_(send), recv_(recv) {
      if (memory.is_host()) return;
      if (!send.empty()) {
        send_copy_.emplace(const_cast<std::byte*>(send.data()), send.size(), memory);
        send_ = send_copy_->host();
      }
      if (!recv.empty()) {
        recv_copy_.emplace(recv.data(), recv.size(), memory, recv_is_read);
        recv_ = recv_copy_->host();
      }
    }
    std::span<const std::byte> send() const { return send_; }
    std::span<std::byte> recv() const { return recv_; }
    void finish() {
      if (recv_copy_) recv_copy_->copy_back();
    }

   private:
    std::span<const std::byte> send_;
    std::span<std::byte> recv_;
    std::optional<comm::HostCopy> send_copy_, recv_copy_;
  };

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
};

// Wraps `inner` (not owned; must outlive the result).
inline std::unique_ptr<Communicator> through_host(Communicator& inner) { return std::make_unique<ThroughHost>(inner); }

}  // namespace gradcomp::testing
