// Communicator: the transport under the compressed collectives. Backends: MPI (comm/mpi), NCCL (comm/nccl),
// threads in one process (comm/local). Every blocking call honours timeout() and throws gradcomp::Timeout past it.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradcomp/tensor.h"

namespace gradcomp {

// kSum: f32, f16, bf16, i32, u8. kAverage: f32, f16, bf16 (sum, then divided by size()). kMax, kMin: f32, i32, u8
// (for negotiation: agreeing on flags and sizes).
enum class ReduceOp { kSum, kAverage, kMax, kMin };

// "sum", "average", "max", "min".
std::string_view reduce_op_name(ReduceOp op);

// A group of ranks. Collective calls must be made by every rank in the same order. Not thread-safe: one thread
// issues the calls of one communicator (the Runtime's background thread, or the test's rank thread).
//
// Memory: every call says where its buffers live (allreduce through its TensorView, the byte calls through a Memory);
// takes() says which memory a backend accepts. A call with memory the backend does not take throws InvalidArgument
// naming the backend, the rank and the memory; compressed_allreduce stages a device tensor through host memory once
// when the communicator does not take its device (comm/host_copy.h, the one place that stages).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "nccl", "local", "torch:gloo", "torch:nccl".
  virtual std::string backend() const = 0;
  // True when every call takes buffers on `device` directly. Host memory: the MPI and in-process backends, torch on
  // gloo, and (staging small control messages itself) NCCL and torch on NCCL. CUDA memory: NCCL (its own device),
  // torch on NCCL, and MPI when the library is CUDA-aware (or GRADCOMP_MPI_CUDA_AWARE=1; =0 keeps it host-only).
  virtual bool takes(Device device) const { return device.is_cpu(); }

  // Deadline for every blocking call (default 60 s, or GRADCOMP_TIMEOUT_S).
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;

  // In-place elementwise reduction of f32, f16 or bf16 (and i32, u8 for kSum) across all ranks, in inout's memory.
  virtual void allreduce(const TensorView& inout, ReduceOp op) = 0;
  // Every rank contributes `send` (same size on every rank); `recv` holds size() blocks in rank order. Both buffers
  // live in `memory`.
  virtual void allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) = 0;
  // Like allgather with per-rank sizes `recv_counts` (bytes, known on every rank); blocks packed in rank order.
  virtual void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                          std::span<std::byte> recv, Memory memory) = 0;
  // Rank r sends send[send_offsets[d] .. +send_counts[d]) to rank d and receives recv_counts[s] bytes from each s,
  // packed in rank order into recv.
  virtual void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                         std::span<std::byte> recv, std::span<const std::size_t> recv_counts, Memory memory) = 0;
  // alltoallv with one block size for every pair, the same on every rank (the caller guarantees it, as for
  // allgather): `send` and `recv` hold size() blocks of send.size() / size() bytes in rank order. The default runs
  // alltoallv; MPI runs MPI_Ialltoall, which takes a log(n)-step algorithm for small blocks.
  virtual void alltoall(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory);
  // Copies root's `buffer` into every rank's.
  virtual void broadcast(std::span<std::byte> buffer, int root, Memory memory) = 0;
  virtual void barrier() = 0;

  // The byte calls on host memory (negotiation messages, agreement fingerprints, blobs).
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    allgather(send, recv, Memory::host());
  }
  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv) {
    allgatherv(send, recv_counts, recv, Memory::host());
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) {
    alltoallv(send, send_counts, recv, recv_counts, Memory::host());
  }
  void alltoall(std::span<const std::byte> send, std::span<std::byte> recv) { alltoall(send, recv, Memory::host()); }
  void broadcast(std::span<std::byte> buffer, int root) { broadcast(buffer, root, Memory::host()); }

  // Splits into sub-communicators of ranks with equal `color`, ordered by `key` (MPI_Comm_split semantics). Collective
  // over all ranks; a rank passing a negative color takes part but gets nullptr. The child inherits timeout().
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Which "node" this rank lives on, for hierarchical collectives: equal values = same node. Collective on its first
  // call (the MPI backend may split by shared memory). GRADCOMP_LOCAL_SIZE=k overrides every backend: node =
  // rank / k (MPI: the world rank, also on a split communicator). Without it: MPI uses MPI_COMM_TYPE_SHARED, the other backends put every rank on node 0.
  virtual int node_color();

 protected:
  // Throws InvalidArgument unless takes(memory.device): "<backend> communicator (rank r): <op> got buffers on
  // cuda:0, but it takes ...".
  void require_memory(Memory memory, std::string_view op) const;
  // alltoall's block size: send.size() / size(); throws InvalidArgument unless send and recv hold size() equal blocks.
  std::size_t alltoall_block(std::span<const std::byte> send, std::span<std::byte> recv) const;
  // Throws InvalidArgument unless `op` is defined for `dtype` (see ReduceOp), naming the backend and rank.
  void require_reduce(DType dtype, ReduceOp op) const;
};

// Runs `call` on `view` in memory `comm` takes: on `view` itself, or, when comm does not take view's device (a CUDA
// tensor on MPI or torch on gloo), on a host copy of it (pooled, copied on view's stream) that is copied back over
// view after `call` returns (not when it throws). The one place that stages device memory for a communicator
// (comm/host_copy.cc); compressed_allreduce and the Python bindings use it. Returns the bytes copied (0, or 2 x
// view.bytes()). Throws InvalidArgument for a CUDA view in a build without CUDA.
std::size_t with_memory_taken(Communicator& comm, const TensorView& view,
                              const std::function<void(const TensorView&)>& call);

// Default deadline of every blocking call: GRADCOMP_TIMEOUT_S (seconds, may be fractional) or 60 s.
std::chrono::milliseconds default_comm_timeout();

// Options for the MPI backend.
struct MpiOptions {
  std::chrono::milliseconds timeout = default_comm_timeout();
};

// The MPI world (a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN). The world and every communicator split from
// it form one family: the first Timeout or MPI error on any member breaks the whole family on every rank (the failing
// rank tells the others), and every later call then throws CommError at once. Initializes MPI if nobody has,
// requesting MPI_THREAD_MULTIPLE (mpi_thread_level() tells what was provided), and then finalizes it at process exit;
// never finalizes an MPI that someone else initialized. Throws CommError when gradcomp was built without MPI.
std::unique_ptr<Communicator> make_mpi_world_communicator(const MpiOptions& options = {});

// A set of `world_size` in-process communicators that talk through shared memory; give communicator r to thread r.
// A rank that stops calling makes the others throw Timeout (naming the ranks that did not arrive); a rank whose
// communicator is destroyed makes the others' next collective throw CommError. After a failure the group is broken:
// every later call on any of its communicators throws CommError.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(
    int world_size, std::chrono::milliseconds timeout = default_comm_timeout());

// The thread level MPI provided ("single", "funneled", "serialized", "multiple"), or "none" when MPI is not
// initialized or gradcomp was built without MPI.
std::string mpi_thread_level();

// NCCL communicator over the ranks of `bootstrap` (the unique id is broadcast through it), on CUDA device
// `device_index`. Every call runs on the communicator's own stream and returns when it is done (with the timeout;
// ncclCommAbort past it); a call on device memory starts after the work queued on its stream (the tensor's, or the
// byte call's Memory::stream: an event) and makes that stream wait for its end. Takes memory of `device_index` and
// host memory (small control messages: staged through device and page-locked blocks the communicator reuses). Throws CommError when
// gradcomp was built without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index);

}  // namespace gradcomp
