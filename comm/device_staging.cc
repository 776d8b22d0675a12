#include "comm/device_staging.h"

#include "comm/host_stage.h"

namespace gradcomp::comm {
namespace {

class DeviceStaging final : public Communicator {
 public:
  explicit DeviceStaging(Communicator& inner) : inner_(inner) {}
  // A split's child owns its inner communicator.
  explicit DeviceStaging(std::unique_ptr<Communicator> owned) : owned_(std::move(owned)), inner_(*owned_) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend() + "+staging"; }
  bool accepts_device_memory() const override { return true; }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void set_timeout(std::chrono::milliseconds timeout) override { inner_.set_timeout(timeout); }
  int node_color() override { return inner_.node_color(); }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    if (!inout.device().is_cuda()) return inner_.allreduce(inout, op);
    HostStage stage(inout);
    inner_.allreduce(stage.host_view(), op);
    stage.copy_back();
  }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    SpanStage stage(send, recv, /*cuda_aware=*/false);
    inner_.allgather(stage.send(), stage.recv());
    stage.copy_back();
  }
  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv) override {
    SpanStage stage(send, recv, false);
    inner_.allgatherv(stage.send(), recv_counts, stage.recv());
    stage.copy_back();
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                 std::span<const std::size_t> recv_counts) override {
    SpanStage stage(send, recv, false);
    inner_.alltoallv(stage.send(), send_counts, stage.recv(), recv_counts);
    stage.copy_back();
  }
  void broadcast(std::span<std::byte> buffer, int root) override {
    SpanStage stage(buffer, buffer, false);
    inner_.broadcast(stage.recv(), root);
    stage.copy_back();
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    auto child = inner_.split(color, key);
    if (!child) return nullptr;
    return std::make_unique<DeviceStaging>(std::move(child));
  }

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
};

}  // namespace

std::unique_ptr<Communicator> stage_device_memory(Communicator& inner) {
  return std::make_unique<DeviceStaging>(inner);
}

}  // namespace gradcomp::comm
