// comm/nccl: NCCL backend. The communicator is created non-blocking (ncclConfig_t.blocking = 0) from a unique id
// broadcast through a bootstrap Communicator. Every operation runs on the communicator's own stream: an allreduce of a
// device tensor first makes that stream wait for an event recorded on the tensor's stream (the producer: torch's, or
// the codec's), so it starts when the tensor is ready and never waits for unrelated work queued after it there, and
// NCCL's kernels never sit on a framework's stream (beside the framework's own NCCL group). A non-blocking
// communicator may return from a call (ncclInProgress) before the operation is even on the stream, so completion is
// two polls under one deadline: ncclCommGetAsyncError until the call has left ncclInProgress (the work is enqueued),
// then an event recorded behind the work until it has run (checking the async error as well); the producer's stream
// then waits for that event too. Past the deadline the communicator is aborted (ncclCommAbort) and Timeout thrown.
// Split and destruction (ncclCommFinalize) are polled the same way. Host byte spans go through staging blocks that are
// reused (comm/nccl/nccl_staging.h).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_env.h"
#include "comm/host_reduce.h"
#include "comm/timed_communicator.h"
#include "comm/nccl/nccl_staging.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#include "kernels/usage_counters.h"

namespace gradcomp {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAverage: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator final : public comm::TimedCommunicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, std::chrono::milliseconds timeout)
      : TimedCommunicator(timeout), comm_(comm), device_(device) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
    GRADCOMP_CUDA_CHECK_IN(cudaSetDevice(device_), fmt::format("nccl communicator rank {}", rank_).c_str());
    GRADCOMP_CUDA_CHECK_IN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                           fmt::format("nccl communicator rank {}", rank_).c_str());
  }
  // Finalizes (flushes outstanding operations; non-blocking, so polled under the timeout), then destroys; aborts
  // instead when finalizing fails or times out. Never throws.
  ~NcclCommunicator() override {
    if (!aborted_) {
      (void)cudaSetDevice(device_);
      ncclResult_t result = ncclCommFinalize(comm_);
      const auto start = std::chrono::steady_clock::now();
      while (result == ncclSuccess || result == ncclInProgress) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state != ncclInProgress) {
          result = state;
          break;
        }
        if (std::chrono::steady_clock::now() - start > timeout_) {
          result = ncclInProgress;
          break;
        }
        std::this_thread::yield();
      }
      if (result == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  // Its own CUDA device, and host memory (staged: the negotiation's and the algorithms' small messages).
  bool takes(Device device) const override { return device.is_cpu() || device == Device::cuda(device_); }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    require_memory(Memory::of(inout), "allreduce");
    require_reduce(inout.dtype(), op);
    const DeviceScope scope(Device::cuda(device_));
    const auto bytes = std::span<std::byte>(static_cast<std::byte*>(inout.data()), inout.bytes());
    if (inout.device().is_cpu()) {
      const comm::NcclStaging::Device device = begin(bytes, bytes, /*in_place=*/true, Memory::host());
      run("allreduce", inout.bytes(), [&](cudaStream_t s) {
        return ncclAllReduce(device.send, device.recv, inout.numel(), nccl_type(inout.dtype()), nccl_op(op), comm_, s);
      });
      return;
    }
    // Ordered after the producer (the tensor's stream) by an event, run on this communicator's stream.
    const auto producer = static_cast<cudaStream_t>(inout.stream());
    begin({}, {}, false, Memory::of(inout));
    run("allreduce", inout.bytes(), [&](cudaStream_t s) {
      return ncclAllReduce(inout.data(), inout.data(), inout.numel(), nccl_type(inout.dtype()), nccl_op(op), comm_, s);
    }, producer);
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "allgather");
    GRADCOMP_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size_),
                   "nccl communicator: allgather on rank {} needs {} x {} bytes, got {}", rank_, size_, send.size(),
                   recv.size());
    const DeviceScope scope(Device::cuda(device_));
    const comm::NcclStaging::Device device = begin(send, recv, false, memory);
    run("allgather", recv.size(), [&](cudaStream_t s) {
      return ncclAllGather(device.send, device.recv, send.size(), ncclUint8, comm_, s);
    }, producer_of(memory));
  }

  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "allgatherv");
    check_counts(recv_counts, recv.size(), "allgatherv");
    GRADCOMP_CHECK(recv_counts[rank_] == send.size(), "nccl communicator: allgatherv on rank {} sends {} bytes, "
                   "recv_counts says {}", rank_, send.size(), recv_counts[rank_]);
    const DeviceScope scope(Device::cuda(device_));
    const comm::NcclStaging::Device device = begin(send, recv, false, memory);
    run("allgatherv", recv.size(), [&](cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      std::size_t offset = 0;
      for (int r = 0; r < size_ && result == ncclSuccess; ++r) {
        const void* source = r == rank_ ? static_cast<const void*>(device.send) : device.recv + offset;
        result = ncclBroadcast(source, device.recv + offset, recv_counts[r], ncclUint8, r, comm_, s);
        offset += recv_counts[r];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    }, producer_of(memory));
  }

  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts, Memory memory) override {
    require_memory(memory, "alltoallv");
    check_counts(send_counts, send.size(), "alltoallv (send)");
    check_counts(recv_counts, recv.size(), "alltoallv (receive)");
    const DeviceScope scope(Device::cuda(device_));
    const comm::NcclStaging::Device device = begin(send, recv, false, memory);
    run("alltoallv", send.size() + recv.size(), [&](cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      std::size_t send_offset = 0, recv_offset = 0;
      for (int peer = 0; peer < size_ && result == ncclSuccess; ++peer) {
        if (send_counts[peer] > 0) {
          result = ncclSend(device.send + send_offset, send_counts[peer], ncclUint8, peer, comm_, s);
        }
        if (result == ncclSuccess && recv_counts[peer] > 0) {
          result = ncclRecv(device.recv + recv_offset, recv_counts[peer], ncclUint8, peer, comm_, s);
        }
        send_offset += send_counts[peer];
        recv_offset += recv_counts[peer];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    }, producer_of(memory));
  }

  void broadcast(std::span<std::byte> buffer, int root, Memory memory) override {
    require_memory(memory, "broadcast");
    GRADCOMP_CHECK(root >= 0 && root < size_, "nccl communicator: broadcast root {} out of range [0, {})", root, size_);
    const DeviceScope scope(Device::cuda(device_));
    const comm::NcclStaging::Device device = begin(buffer, buffer, /*in_place=*/true, memory);
    run("broadcast", buffer.size(), [&](cudaStream_t s) {
      return ncclBroadcast(device.send, device.recv, buffer.size(), ncclUint8, root, comm_, s);
    }, producer_of(memory));
  }

  void barrier() override {
    std::int32_t token = 0;
    allreduce(TensorView(&token, 1, DType::kI32), ReduceOp::kSum);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const DeviceScope scope(Device::cuda(device_));
    check(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config), "ncclCommSplit");
    // The parent is non-blocking too: the split may still be in progress on it (also on a rank that takes no part
    // and gets no child), and it must not be used for anything else before it is done.
    wait_ready(comm_, "ncclCommSplit (parent)");
    if (child == nullptr) return nullptr;
    wait_ready(child, "ncclCommSplit");
    return std::make_unique<NcclCommunicator>(child, device_, timeout_);
  }

 private:
  void check(ncclResult_t result, std::string_view what) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    throw CommError(fmt::format("nccl communicator: {} failed on rank {} of {}: {} ({})", what, rank_, size_,
                                ncclGetErrorString(result), ncclGetLastError(comm_)));
  }

  // Polls a non-blocking communicator until its pending initialization/split is done. On failure or past the
  // deadline it aborts `comm` (marking this communicator aborted when `comm` is its own) and throws.
  void wait_ready(ncclComm_t comm, std::string_view what) {
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
      if (query != ncclSuccess) state = query;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        ncclCommAbort(comm);
        if (comm == comm_) aborted_ = true;
        throw CommError(fmt::format("nccl communicator: {} failed on rank {}: {}", what, rank_,
                                    ncclGetErrorString(state)));
      }
      if (std::chrono::steady_clock::now() - start > timeout_) {
        ncclCommAbort(comm);
        if (comm == comm_) aborted_ = true;
        throw Timeout(fmt::format("nccl communicator: {} timed out on rank {} after {} ms", what, rank_,
                                  comm::ms_since(start)));
      }
      std::this_thread::yield();
    }
  }

  // The stream that produced a call's device buffers (and then waits for the call), none for host memory.
  static std::optional<cudaStream_t> producer_of(Memory memory) {
    if (memory.is_host()) return std::nullopt;
    return static_cast<cudaStream_t>(memory.stream);
  }

  // Prepares one operation (the caller holds a DeviceScope of device_): refuses after an abort, orders its stream
  // after the stream that produced device buffers (an event) and stages host spans (NcclStaging).
  comm::NcclStaging::Device begin(std::span<const std::byte> send, std::span<std::byte> recv, bool in_place,
                                  Memory memory) {
    GRADCOMP_CHECK_AS(CommError, !aborted_, "nccl communicator on rank {} refused a call: it was aborted after an "
                      "earlier failure", rank_);
    if (const auto producer = producer_of(memory)) {
      produced_.record(*producer);
      produced_.order_before(stream_);
    }
    return staging_.stage(send, recv, in_place, memory.is_host(), stream_);
  }

  // Enqueues `launch` on this communicator's stream and waits for it with the deadline; `producer` (when given) then
  // waits for it on the device as well.
  template <typename Launch>
  void run(std::string_view op, std::size_t bytes, Launch&& launch, std::optional<cudaStream_t> producer = {}) {
    check(launch(stream_), op);
    const auto start = std::chrono::steady_clock::now();
    // Phase 1 (enqueued): while the call is ncclInProgress the stream may not hold the operation yet, so an event
    // recorded now could pass while NCCL still reads and writes the buffers. Phase 2 (ran): the event behind it.
    bool enqueued = false;
    for (unsigned spins = 0;; ++spins) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
      if (query != ncclSuccess) async = query;
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        aborted_ = true;
        throw CommError(fmt::format("nccl communicator: {} of {} bytes failed on rank {} of {}: {}", op, bytes, rank_,
                                    size_, ncclGetErrorString(async)));
      }
      if (!enqueued && async == ncclSuccess) {
        enqueued = true;
        staging_.copy_back_async(stream_);
        done_.record(stream_);
      }
      if (enqueued && done_.reached()) break;
      if (std::chrono::steady_clock::now() - start > timeout_) {
        ncclCommAbort(comm_);
        aborted_ = true;
        throw Timeout(fmt::format("nccl communicator: {} of {} bytes timed out on rank {} of {} after {} ms (limit {} "
                                  "ms, {}); the communicator was aborted",
                                  op, bytes, rank_, size_, comm::ms_since(start), timeout_.count(),
                                  enqueued ? "enqueued, the stream did not finish" : "still being enqueued"));
      }
      if (spins > 256) std::this_thread::yield();
    }
    kernels::note_synchronization();  // the host waited for the device (polling)
    staging_.finish();
    if (producer) done_.order_before(*producer);
  }

  void check_counts(std::span<const std::size_t> counts, std::size_t total, std::string_view what) const {
    GRADCOMP_CHECK(counts.size() == static_cast<std::size_t>(size_),
                   "nccl communicator: {} on rank {} needs {} counts, got {}", what, rank_, size_, counts.size());
    const std::size_t sum = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    GRADCOMP_CHECK(sum == total, "nccl communicator: {} on rank {}: counts add up to {} bytes, buffer has {}", what,
                   rank_, sum, total);
  }

  ncclComm_t comm_;
  int device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  kernels::StreamMark produced_;  // the producer's stream, where an allreduce's tensor is ready
  kernels::StreamMark done_;      // behind the last operation on stream_
  comm::NcclStaging staging_;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index) {
  int devices = 0;
  GRADCOMP_CUDA_CHECK_IN(cudaGetDeviceCount(&devices),
                         fmt::format("nccl communicator rank {}", bootstrap.rank()).c_str());
  GRADCOMP_CHECK(device_index >= 0 && device_index < devices,
                 "make_nccl_communicator: rank {} asked for CUDA device {} but {} device(s) are visible",
                 bootstrap.rank(), device_index, devices);
  GRADCOMP_CUDA_CHECK_IN(cudaSetDevice(device_index),
                         fmt::format("nccl communicator rank {}", bootstrap.rank()).c_str());
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw CommError(fmt::format("ncclGetUniqueId failed on rank 0: {}", ncclGetErrorString(result)));
    }
  }
  bootstrap.broadcast(std::as_writable_bytes(std::span(&id, 1)), 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    throw CommError(fmt::format("ncclCommInitRankConfig failed on rank {} of {}: {}", bootstrap.rank(),
                                bootstrap.size(), ncclGetErrorString(result)));
  }
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      throw CommError(fmt::format("NCCL initialization failed on rank {} of {}: {}", bootstrap.rank(),
                                  bootstrap.size(), ncclGetErrorString(state)));
    }
    if (std::chrono::steady_clock::now() - start > bootstrap.timeout()) {
      ncclCommAbort(comm);
      throw Timeout(fmt::format("NCCL initialization timed out on rank {} of {} after {} ms", bootstrap.rank(),
                                bootstrap.size(), comm::ms_since(start)));
    }
    std::this_thread::yield();
  }
  return std::make_unique<NcclCommunicator>(comm, device_index, bootstrap.timeout());
}

}  // namespace gradcomp
