// comm/mpi: Open MPI backend. Every blocking operation is a non-blocking MPI call completed by an MPI_Test loop with
// a deadline, so a dead or stuck peer surfaces as gradcomp::Timeout instead of a hang; MPI error codes (the
// communicator uses MPI_ERRORS_RETURN) become CommError. After the first failure the communicator and its whole
// family (comm/mpi/mpi_family.h) refuse every call with CommError, on every rank that hears of it. MPI only ever sees
// buffers this communicator owns: an abandoned collective cannot write into memory the caller freed. It takes host
// memory, and CUDA memory when the MPI library is CUDA-aware (comm/mpi/mpi_cuda_aware.h; its own device blocks,
// comm/mpi/mpi_buffers.h); otherwise compressed_allreduce stages device tensors once.
#include "comm/mpi/mpi_support.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_env.h"
#include "comm/host_copy.h"
#include "comm/host_reduce.h"
#include "comm/timed_communicator.h"
#include "comm/mpi/mpi_buffers.h"
#include "comm/mpi/mpi_cuda_aware.h"
#include "comm/mpi/mpi_family.h"
#include "comm/mpi/mpi_gather_rounds.h"
#include "comm/mpi/mpi_ring.h"
#include "comm/owned_buffer_allreduce.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "src/core/env.h"

namespace gradcomp {
namespace {

using mpi::copy_bytes;
using mpi::nonnull;
using mpi::OpBuffers;
using mpi::to_int;

class MpiCommunicator final : public comm::TimedCommunicator, public OwnedBufferAllreduce {
 public:
  // `comm` is the family's root (not freed here) or a communicator split from a member (freed here while unbroken).
  // `cuda_aware`: takes CUDA memory (mpi::cuda_aware()).
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<mpi::MpiFamily> family, std::chrono::milliseconds timeout,
                  bool cuda_aware)
      : TimedCommunicator(timeout),
        comm_(comm),
        family_(std::move(family)),
        cuda_aware_(cuda_aware),
        ring_min_bytes_(mpi::ring_min_bytes_from_env()),
        ops_(std::make_shared<OpBuffers>()) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    owns_comm_ = comm_ != family_->root();
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && owns_comm_ && !family_->broken()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  bool takes(Device device) const override { return device.is_cpu() || (cuda_aware_ && device.is_cuda()); }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    require_memory(Memory::of(inout), "allreduce");
    require_reduce(inout.dtype(), op);
    const int count = to_int(inout.numel(), "allreduce element count", rank_);
    if (!inout.device().is_cpu()) return allreduce_on_device(inout, op, count);
    enter("allreduce");
    learn_layout(inout.bytes());
    const std::shared_ptr<OpBuffers> ops = ops_;  // kept: an abandoned request swaps ops_ for fresh buffers
    ops->send.resize(inout.bytes());
    copy_bytes(ops->send.data(), inout.data(), inout.bytes());
    const std::byte* result = reduce_owned(*ops, 0, count, inout.dtype(), op, inout.bytes());
    copy_bytes(inout.data(), result, inout.bytes());
    if (op == ReduceOp::kAverage) comm::divide_by(inout.data(), inout.numel(), inout.dtype(), size_);
  }

  void allreduce_in_owned_buffer(std::size_t capacity, const Fill& fill, const Drain& drain) override {
    enter("allreduce");
    learn_layout(capacity);
    const std::shared_ptr<OpBuffers> ops = ops_;  // kept: an abandoned request swaps ops_ for fresh buffers
    ops->send.resize(capacity);
    const Filled filled = fill(std::span<std::byte>(ops->send.data(), capacity));
    const std::size_t element = dtype_size(filled.dtype);
    GRADCOMP_CHECK(filled.bytes <= capacity && filled.offset <= filled.bytes &&
                       filled.count <= (filled.bytes - filled.offset) / element,
                   "mpi communicator: owned-buffer allreduce on rank {}: {} elements of {} at byte {} do not fit the {} "
                   "bytes written (capacity {})",
                   rank_, filled.count, dtype_name(filled.dtype), filled.offset, filled.bytes, capacity);
    require_reduce(filled.dtype, ReduceOp::kSum);
    const int count = to_int(filled.count, "allreduce element count", rank_);
    const std::byte* body = reduce_owned(*ops, filled.offset, count, filled.dtype, ReduceOp::kSum,
                                         filled.count * element);
    const std::byte* result = body - filled.offset;
    if (result != ops->send.data()) {  // reduced into the receive buffer: the bytes around the array come along
      const std::size_t end = filled.offset + filled.count * element;
      copy_bytes(ops->recv.data(), ops->send.data(), filled.offset);
      copy_bytes(ops->recv.data() + end, ops->send.data() + end, filled.bytes - end);
    }
    drain(std::span<const std::byte>(result, filled.bytes));
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "allgather");
    GRADCOMP_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size_),
                   "mpi communicator: allgather on rank {} needs a receive buffer of {} x {} bytes, got {}", rank_,
                   size_, send.size(), recv.size());
    const int count = to_int(send.size(), "allgather bytes", rank_);
    to_int(recv.size(), "allgather receive bytes", rank_);
    enter("allgather");
    const mpi::Staged b = mpi::stage_in(*ops_, send, recv.size(), memory);
    MPI_Request request;
    check(MPI_Iallgather(nonnull(b.send), count, MPI_BYTE, nonnull(b.recv), count, MPI_BYTE, comm_, &request),
          "MPI_Iallgather", send.size());
    wait(request, "allgather", recv.size());
    mpi::copy_out(*ops_, recv, b.recv, memory);
  }

  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "allgatherv");
    OpBuffers& b = *ops_;
    const bool rounds = memory.is_host() && recv.size() > mpi::max_message_bytes();  // host: beyond MPI's ints
    mpi::to_counts(recv_counts, recv.size(), b.counts, b.displs, "allgatherv", rank_, size_, !rounds);
    GRADCOMP_CHECK(recv_counts[rank_] == send.size(), "mpi communicator: allgatherv on rank {} sends {} bytes but "
                   "recv_counts[{}] = {}", rank_, send.size(), rank_, recv_counts[rank_]);
    enter("allgatherv");
    if (rounds) {
      return mpi::allgatherv_in_rounds(send, recv_counts, recv, rank_, mpi::max_message_bytes(), b.recv,
                                       [this](auto... args) { gatherv(args...); });
    }
    const mpi::Staged staged = mpi::stage_in(b, send, recv.size(), memory);
    gatherv(staged.send, b.counts[rank_], b.counts, b.displs, staged.recv);
    mpi::copy_out(b, recv, staged.recv, memory);
  }

  // One MPI_Iallgatherv (byte counts and displacements), waited for.
  void gatherv(const std::byte* mine, int n, const std::vector<int>& counts, const std::vector<int>& displs,
               std::byte* into) {
    MPI_Request request;
    check(MPI_Iallgatherv(nonnull(const_cast<std::byte*>(mine)), n, MPI_BYTE, nonnull(into), counts.data(),
                          displs.data(), MPI_BYTE, comm_, &request), "MPI_Iallgatherv", static_cast<std::size_t>(n));
    wait(request, "allgatherv", static_cast<std::size_t>(n));
  }

  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts, Memory memory) override {
    require_memory(memory, "alltoallv");
    OpBuffers& b = *ops_;
    mpi::to_counts(send_counts, send.size(), b.counts, b.displs, "alltoallv (send)", rank_, size_);
    mpi::to_counts(recv_counts, recv.size(), b.recv_counts, b.recv_displs, "alltoallv (receive)", rank_, size_);
    enter("alltoallv");
    const mpi::Staged staged = mpi::stage_in(b, send, recv.size(), memory);
    MPI_Request request;
    check(MPI_Ialltoallv(nonnull(staged.send), b.counts.data(), b.displs.data(), MPI_BYTE, nonnull(staged.recv),
                         b.recv_counts.data(), b.recv_displs.data(), MPI_BYTE, comm_, &request),
          "MPI_Ialltoallv", send.size());
    wait(request, "alltoallv", send.size() + recv.size());
    mpi::copy_out(b, recv, staged.recv, memory);
  }

  // MPI_Ialltoall: for small blocks (sra's chunk sizes) MPI takes a log(n)-step algorithm (Bruck) where alltoallv
  // sends n - 1 messages.
  void alltoall(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "alltoall");
    const int block = to_int(alltoall_block(send, recv), "alltoall block", rank_);
    enter("alltoall");
    const mpi::Staged staged = mpi::stage_in(*ops_, send, recv.size(), memory);
    MPI_Request request;
    check(MPI_Ialltoall(nonnull(staged.send), block, MPI_BYTE, nonnull(staged.recv), block, MPI_BYTE, comm_, &request),
          "MPI_Ialltoall", send.size());
    wait(request, "alltoall", send.size() + recv.size());
    mpi::copy_out(*ops_, recv, staged.recv, memory);
  }

  void broadcast(std::span<std::byte> buffer, int root, Memory memory) override {
    require_memory(memory, "broadcast");
    GRADCOMP_CHECK(root >= 0 && root < size_, "mpi communicator: broadcast root {} out of range [0, {})", root, size_);
    enter("broadcast");
    const mpi::Staged b = mpi::stage_in(*ops_, buffer, 0, memory);  // the root's data; overwritten elsewhere
    // In pieces (MPI counts are ints; a 1.3B-value f32 tensor is 5.2 GB): one MPI_Ibcast each, in order.
    auto* data = static_cast<std::byte*>(nonnull(b.send));
    const std::size_t piece = mpi::max_message_bytes();
    std::size_t offset = 0;
    do {
      const std::size_t n = std::min(piece, buffer.size() - offset);
      MPI_Request request;
      check(MPI_Ibcast(data + offset, static_cast<int>(n), MPI_BYTE, root, comm_, &request), "MPI_Ibcast", n);
      wait(request, "broadcast", n);
      offset += n;
    } while (offset < buffer.size());
    mpi::copy_out(*ops_, buffer, b.send, memory);
  }

  void barrier() override {
    enter("barrier");
    MPI_Request request;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", 0);
    wait(request, "barrier", 0);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    enter("split");
    // MPI_Comm_split blocks without a deadline; a timed allgather first proves every rank has arrived.
    std::int32_t mine[2] = {color, key};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size_));
    allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), Memory::host());
    MPI_Comm child = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split", 0);
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(child, family_, timeout_, cuda_aware_);
  }

  int node_color() override {
    if (node_color_) return *node_color_;
    if (const auto local = comm::local_size_from_env()) {
      node_color_ = family_->root_rank() / *local;  // the world rank: a split communicator's ranks keep their node
      return *node_color_;
    }
    barrier();  // MPI_Comm_split_type blocks: make sure everybody is here first
    MPI_Comm shared = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared), "MPI_Comm_split_type", 0);
    MpiCommunicator node(shared, family_, timeout_, cuda_aware_);
    std::int32_t leader = rank_;
    node.broadcast(std::as_writable_bytes(std::span(&leader, 1)), 0, Memory::host());
    node_color_ = leader;
    return leader;
  }

 private:
  // "rank r of n", plus the world rank for a communicator split from the world.
  std::string where() const {
    if (!owns_comm_) return fmt::format("rank {} of {}", rank_, size_);
    return fmt::format("rank {} of {} (world rank {} of {})", rank_, size_, family_->root_rank(), family_->root_size());
  }

  // Every call starts here: a broken family (this rank's own failure, or another rank's message) refuses at once.
  void enter(std::string_view op) {
    if (!family_->poll()) return;
    throw CommError(fmt::format("mpi communicator: {} refused on {}: the communicator is broken since its first "
                                "failure ({}); every later call fails — create a new communicator or restart",
                                op, where(), family_->failure()));
  }

  void check(int rc, std::string_view call, std::size_t bytes) {
    if (rc == MPI_SUCCESS) return;
    const std::string what =
        fmt::format("{}: {} failed ({} bytes): {}", where(), call, bytes, mpi::error_string(rc));
    family_->fail(what);
    throw CommError(fmt::format("mpi communicator: {}", what));
  }

  // Reduces the `count` elements at byte `offset` of ops.send (`bytes` long) across ranks and returns where the result
  // lies: in place (our ring, comm/mpi/mpi_ring.h, for arrays of at least ring_min_bytes_), or at the same offset of
  // ops.recv (MPI_Iallreduce, latency-bound sizes; separate send and receive buffers, not MPI_IN_PLACE: Open MPI's
  // libnbc then uses its ring for large messages instead of a binomial reduce + broadcast). kAverage sums here (the
  // caller divides).
  const std::byte* reduce_owned(OpBuffers& ops, std::size_t offset, int count, DType dtype, ReduceOp op,
                                std::size_t bytes) {
    const MPI_Op mpi_op = mpi::reduce_op(dtype, op);
    std::byte* send = ops.send.data() + offset;
    if (size_ > 1 && bytes >= ring_min_bytes_ && count >= size_ && ring_layout_.value_or(false)) {
      const auto start = std::chrono::steady_clock::now();
      mpi::RingHooks hooks;
      hooks.idle = [&](unsigned passes, const mpi::RingHooks::InFlight& in_flight) {
        pace(passes, start, "allreduce", bytes, in_flight);
      };
      hooks.fail = [&](int rc, std::string_view call, const mpi::RingHooks::InFlight& in_flight) {
        abandon(in_flight());
        check(rc, call, bytes);
      };
      mpi::ring_allreduce(send, static_cast<std::size_t>(count), mpi::datatype(dtype), dtype_size(dtype), mpi_op,
                          comm_, ops.scratch, hooks);
      return send;
    }
    ops.recv.resize(ops.send.size());
    std::byte* recv = ops.recv.data() + offset;
    MPI_Request request;
    check(MPI_Iallreduce(nonnull(send), nonnull(recv), count, mpi::datatype(dtype), mpi_op, comm_, &request),
          "MPI_Iallreduce", bytes);
    wait(request, "allreduce", bytes);
    return recv;
  }

  // Before the first allreduce that may take the ring (`bytes`: its size, or the staged call's capacity, equal on
  // every rank), learns the layout from every rank's node_color() (the nodes the hierarchical mode uses): collectives
  // every rank reaches in the same call, made before the call's own buffers are filled (they use them).
  void learn_layout(std::size_t bytes) {
    if (size_ == 1 || bytes < ring_min_bytes_ || ring_layout_) return;
    ring_layout_ = mpi::ring_suits(*this);
  }

  // allreduce of CUDA memory (a CUDA-aware MPI): MPI_Iallreduce over the device blocks with MPI's own ops; a
  // reduction MPI can only run on the host (f16/bf16 sums: a user-defined op; the average's division) goes through a
  // host copy (comm/host_copy.h) and the host path.
  void allreduce_on_device(const TensorView& inout, ReduceOp op, int count) {
    if (inout.dtype() == DType::kF16 || inout.dtype() == DType::kBF16 || op == ReduceOp::kAverage) {
      comm::HostCopy copy(inout);
      allreduce(copy.host_view(), op);
      copy.copy_back();
      return;
    }
    enter("allreduce");
    const Memory memory = Memory::of(inout);
    const std::span<std::byte> bytes(static_cast<std::byte*>(inout.data()), inout.bytes());
    const mpi::Staged b = mpi::stage_in(*ops_, bytes, bytes.size(), memory);
    const MPI_Op mpi_op = mpi::reduce_op(inout.dtype(), op);
    MPI_Request request;
    check(MPI_Iallreduce(nonnull(b.send), nonnull(b.recv), count, mpi::datatype(inout.dtype()), mpi_op, comm_,
                         &request),
          "MPI_Iallreduce", bytes.size());
    wait(request, "allreduce", bytes.size());
    mpi::copy_out(*ops_, bytes, b.recv, memory);
  }

  // Gives up on `request`: it and the buffers it targets go to the graveyard, the communicator gets fresh ones.
  void abandon(std::vector<MPI_Request> requests) {
    mpi::bury(std::move(requests), ops_);
    ops_ = std::make_shared<OpBuffers>();
  }

  // Completes `request` by polling MPI_Test until the deadline, watching for another rank's failure meanwhile (in a
  // simulated build: MPI_Wait, mpi::kBlockingWaits).
  void wait(MPI_Request& request, std::string_view op, std::size_t bytes) {
    if constexpr (mpi::kBlockingWaits) {
      check(MPI_Wait(&request, MPI_STATUS_IGNORE), fmt::format("{} (MPI_Wait)", op), bytes);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (unsigned spins = 1;; ++spins) {
      int done = 0;
      const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        abandon({request});
        check(rc, fmt::format("{} (MPI_Test)", op), bytes);
      }
      if (done) return;
      pace(spins, start, op, bytes, [&] { return std::vector<MPI_Request>{request}; });
    }
  }

  // Between two polls of operation `op` (started at `start`; `spins` polls without progress so far): throws
  // CommError when another rank failed, Timeout when the deadline passed (both after abandoning `in_flight`);
  // otherwise backs off (mpi::back_off).
  void pace(unsigned spins, std::chrono::steady_clock::time_point start, std::string_view op, std::size_t bytes,
            const mpi::RingHooks::InFlight& in_flight) {
    if (family_->poll()) {
      abandon(in_flight());
      throw CommError(fmt::format("mpi communicator: {} of {} bytes abandoned on {} after {} ms: another rank "
                                  "failed first ({})",
                                  op, bytes, where(), comm::ms_since(start), family_->failure()));
    }
    if (std::chrono::steady_clock::now() > start + timeout_) {
      abandon(in_flight());
      const std::string what = fmt::format("{}: {} of {} bytes timed out after {} ms (limit {} ms): a peer rank is "
                                           "missing, dead or stuck",
                                           where(), op, bytes, comm::ms_since(start), timeout_.count());
      family_->fail(what);
      throw Timeout(fmt::format("mpi communicator: {}", what));
    }
    mpi::back_off(spins);
  }

  MPI_Comm comm_;
  std::shared_ptr<mpi::MpiFamily> family_;
  bool cuda_aware_ = false;
  int rank_ = 0, size_ = 1;
  bool owns_comm_ = false;
  std::size_t ring_min_bytes_;
  // Whether the ring suits where the ranks run (mpi::ring_suits: one node, or one rank per node). With several nodes
  // of several ranks a flat ring crosses each node's uplink with 1.5x the array (2 x 2 ranks) where MPI's recursive
  // halving sends it once (docs/comm.md); those jobs keep MPI_Iallreduce (or take the hierarchical mode). Learned by
  // learn_layout().
  std::optional<bool> ring_layout_;
  std::optional<int> node_color_;
  std::shared_ptr<OpBuffers> ops_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(const MpiOptions& options) {
  GRADCOMP_CHECK(options.timeout.count() > 0, "make_mpi_world_communicator: timeout must be positive, got {} ms",
                 options.timeout.count());
  mpi::ensure_initialized();
  const bool cuda_aware = mpi::cuda_aware();  // before the dup: a bad GRADCOMP_MPI_CUDA_AWARE throws
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS) {
    throw CommError(fmt::format("MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi::error_string(rc)));
  }
  auto family = std::make_shared<mpi::MpiFamily>(world);
  return std::make_unique<MpiCommunicator>(world, std::move(family), options.timeout, cuda_aware);
}

}  // namespace gradcomp
