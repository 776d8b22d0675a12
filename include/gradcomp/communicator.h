// Communicator: the transport under the compressed collectives. Backends: MPI (comm/mpi), NCCL (comm/nccl),
// threads in one process (comm/local). Every blocking call honours timeout() and throws gradcomp::Timeout past it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gradcomp/tensor.h"

namespace gradcomp {

enum class ReduceOp { kSum, kAverage };

// A group of ranks. Collective calls must be made by every rank in the same order. Not thread-safe: one thread
// issues the calls of one communicator (the Runtime's background thread, or the test's rank thread).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "nccl", "local".
  virtual std::string backend() const = 0;

  // Deadline for every blocking call (default 60 s, or GRADCOMP_TIMEOUT_S).
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;

  // In-place elementwise reduction of f32, f16 or bf16 (and i32, u8 for kSum) across all ranks.
  virtual void allreduce(const TensorView& inout, ReduceOp op) = 0;
  // Every rank contributes `send` (same size on every rank); `recv` holds size() blocks in rank order.
  virtual void allgather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // Like allgather with per-rank sizes `recv_counts` (bytes, known on every rank); blocks packed in rank order.
  virtual void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                          std::span<std::byte> recv) = 0;
  // Rank r sends send[send_offsets[d] .. +send_counts[d]) to rank d and receives recv_counts[s] bytes from each s,
  // packed in rank order into recv.
  virtual void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                         std::span<std::byte> recv, std::span<const std::size_t> recv_counts) = 0;
  // Copies root's `buffer` into every rank's.
  virtual void broadcast(std::span<std::byte> buffer, int root) = 0;
  virtual void barrier() = 0;

  // Splits into sub-communicators of ranks with equal `color`, ordered by `key` (MPI_Comm_split semantics).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// Options for the MPI backend.
struct MpiOptions {
  std::chrono::milliseconds timeout{60000};
};

// The MPI world (initializes MPI with MPI_THREAD_MULTIPLE-or-less if needed; finalizes at exit if it did).
// Throws CommError when gradcomp was built without MPI.
std::unique_ptr<Communicator> make_mpi_world_communicator(const MpiOptions& options = {});

// A set of `world_size` in-process communicators that talk through shared memory; give communicator r to thread r.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(int world_size,
                                                                    std::chrono::milliseconds timeout =
                                                                        std::chrono::milliseconds(60000));

// NCCL communicator over the ranks of `bootstrap` (the unique id is broadcast through it), on CUDA device
// `device_index`. Throws CommError when gradcomp was built without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index);

}  // namespace gradcomp
