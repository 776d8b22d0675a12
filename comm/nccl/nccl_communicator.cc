// comm/nccl: NCCL backend. The communicator is created non-blocking (ncclConfig_t.blocking = 0) from a unique id
// broadcast through a bootstrap Communicator; every operation is enqueued on a CUDA stream (the tensor's stream for
// allreduce, the communicator's own stream for the byte-span calls). A non-blocking communicator may return from a
// call (ncclInProgress) before the operation is even on the stream, so completion is two polls under one deadline:
// ncclCommGetAsyncError until the call has left ncclInProgress (the work is enqueued), then cudaStreamQuery until the
// stream has run it (checking the async error as well). Past the deadline the communicator is aborted
// (ncclCommAbort) and Timeout thrown. Split and destruction (ncclCommFinalize) are polled the same way.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_util.h"
#include "comm/host_stage.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "kernels/cuda_check.h"

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

// Device memory for a byte span: the span itself when it is device memory, else a device copy (host spans are for
// bootstrap-sized metadata; they cost a cudaMalloc per call).
class DeviceBytes {
 public:
  DeviceBytes(std::span<const std::byte> bytes, bool copy_in, int rank) : rank_(rank), size_(bytes.size()) {
    if (bytes.empty() || comm::is_device_pointer(bytes.data())) {
      device_ = const_cast<std::byte*>(bytes.data());
      return;
    }
    host_ = const_cast<std::byte*>(bytes.data());
    GRADCOMP_CUDA_CHECK_IN(cudaMalloc(reinterpret_cast<void**>(&device_), size_),
                           fmt::format("nccl communicator rank {}", rank_).c_str());
    owned_ = true;
    if (copy_in) {
      GRADCOMP_CUDA_CHECK_IN(cudaMemcpy(device_, host_, size_, cudaMemcpyHostToDevice),
                             fmt::format("nccl communicator rank {}", rank_).c_str());
    }
  }
  ~DeviceBytes() {
    if (owned_) cudaFree(device_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  std::byte* data() const { return device_; }
  void copy_out() {
    if (owned_) {
      GRADCOMP_CUDA_CHECK_IN(cudaMemcpy(host_, device_, size_, cudaMemcpyDeviceToHost),
                             fmt::format("nccl communicator rank {}", rank_).c_str());
    }
  }

 private:
  int rank_;
  std::size_t size_;
  std::byte* device_ = nullptr;
  std::byte* host_ = nullptr;
  bool owned_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, std::chrono::milliseconds timeout)
      : comm_(comm), device_(device), timeout_(timeout) {
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
  bool accepts_device_memory() const override { return true; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override {
    GRADCOMP_CHECK(timeout.count() > 0, "nccl communicator: timeout must be positive, got {} ms", timeout.count());
    timeout_ = timeout;
  }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    comm::check_reduce(inout.dtype(), op, "nccl", rank_);
    if (inout.device().is_cpu()) {
      DeviceBytes device({static_cast<const std::byte*>(inout.data()), inout.bytes()}, true, rank_);
      run("allreduce", inout.bytes(), stream_, [&](cudaStream_t s) {
        return ncclAllReduce(device.data(), device.data(), inout.numel(), nccl_type(inout.dtype()), nccl_op(op),
                             comm_, s);
      });
      device.copy_out();
      return;
    }
    auto stream = static_cast<cudaStream_t>(inout.stream());
    run("allreduce", inout.bytes(), stream, [&](cudaStream_t s) {
      return ncclAllReduce(inout.data(), inout.data(), inout.numel(), nccl_type(inout.dtype()), nccl_op(op), comm_, s);
    });
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    GRADCOMP_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size_),
                   "nccl communicator: allgather on rank {} needs {} x {} bytes, got {}", rank_, size_, send.size(),
                   recv.size());
    DeviceBytes in(send, true, rank_);
    DeviceBytes out(recv, false, rank_);
    run("allgather", recv.size(), stream_, [&](cudaStream_t s) {
      return ncclAllGather(in.data(), out.data(), send.size(), ncclUint8, comm_, s);
    });
    out.copy_out();
  }

  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv) override {
    check_counts(recv_counts, recv.size(), "allgatherv");
    GRADCOMP_CHECK(recv_counts[rank_] == send.size(), "nccl communicator: allgatherv on rank {} sends {} bytes, "
                   "recv_counts says {}", rank_, send.size(), recv_counts[rank_]);
    DeviceBytes in(send, true, rank_);
    DeviceBytes out(recv, false, rank_);
    run("allgatherv", recv.size(), stream_, [&](cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      std::size_t offset = 0;
      for (int r = 0; r < size_ && result == ncclSuccess; ++r) {
        const void* source = r == rank_ ? static_cast<const void*>(in.data()) : out.data() + offset;
        result = ncclBroadcast(source, out.data() + offset, recv_counts[r], ncclUint8, r, comm_, s);
        offset += recv_counts[r];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    });
    out.copy_out();
  }

  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    check_counts(send_counts, send.size(), "alltoallv (send)");
    check_counts(recv_counts, recv.size(), "alltoallv (receive)");
    DeviceBytes in(send, true, rank_);
    DeviceBytes out(recv, false, rank_);
    run("alltoallv", send.size() + recv.size(), stream_, [&](cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      std::size_t send_offset = 0, recv_offset = 0;
      for (int peer = 0; peer < size_ && result == ncclSuccess; ++peer) {
        if (send_counts[peer] > 0) {
          result = ncclSend(in.data() + send_offset, send_counts[peer], ncclUint8, peer, comm_, s);
        }
        if (result == ncclSuccess && recv_counts[peer] > 0) {
          result = ncclRecv(out.data() + recv_offset, recv_counts[peer], ncclUint8, peer, comm_, s);
        }
        send_offset += send_counts[peer];
        recv_offset += recv_counts[peer];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    });
    out.copy_out();
  }

  void broadcast(std::span<std::byte> buffer, int root) override {
    GRADCOMP_CHECK(root >= 0 && root < size_, "nccl communicator: broadcast root {} out of range [0, {})", root, size_);
    DeviceBytes data(buffer, true, rank_);
    run("broadcast", buffer.size(), stream_, [&](cudaStream_t s) {
      return ncclBroadcast(data.data(), data.data(), buffer.size(), ncclUint8, root, comm_, s);
    });
    data.copy_out();
  }

  void barrier() override {
    std::int32_t token = 0;
    allreduce(TensorView(&token, 1, DType::kI32), ReduceOp::kSum);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    GRADCOMP_CUDA_CHECK_IN(cudaSetDevice(device_), fmt::format("nccl communicator rank {}", rank_).c_str());
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

  // Enqueues `launch` on `stream` and waits for it with the deadline.
  template <typename Launch>
  void run(std::string_view op, std::size_t bytes, cudaStream_t stream, Launch&& launch) {
    GRADCOMP_CHECK_AS(CommError, !aborted_, "nccl communicator: {} on rank {} refused: the communicator was aborted "
                      "after an earlier failure", op, rank_);
    GRADCOMP_CUDA_CHECK_IN(cudaSetDevice(device_), fmt::format("nccl communicator rank {}", rank_).c_str());
    check(launch(stream), op);
    const auto start = std::chrono::steady_clock::now();
    // Phase 1 (enqueued): while the call is ncclInProgress the stream may not hold the operation yet, so an empty
    // stream would look finished while NCCL still reads and writes the buffers. Phase 2 (ran): the stream.
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
      enqueued = enqueued || async == ncclSuccess;
      if (enqueued) {
        const cudaError_t status = cudaStreamQuery(stream);
        if (status == cudaSuccess) return;
        if (status != cudaErrorNotReady)
          GRADCOMP_CUDA_CHECK_IN(status, fmt::format("nccl communicator rank {}, {}", rank_, op).c_str());
      }
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
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
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
