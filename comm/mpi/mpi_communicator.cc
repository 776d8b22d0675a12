// comm/mpi: Open MPI backend. Every blocking operation is a non-blocking MPI call completed by an MPI_Test loop with
// a deadline, so a dead or stuck peer surfaces as gradcomp::Timeout instead of a hang; MPI error codes (the
// communicator uses MPI_ERRORS_RETURN) become CommError. f16/bf16 sums use user-defined MPI ops.
// The C API only (Open MPI and MPICH would otherwise pull in their deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <atomic>
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_util.h"
#include "comm/host_stage.h"
#include "gradcomp/communicator.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"

namespace gradcomp {
namespace {

// Set once any MPI operation failed or timed out: MPI_Finalize could then wait forever on the lost peer, so the
// exit handler skips it (mpirun reports the missing finalize, which is the truth).
std::atomic<bool> g_mpi_failed{false};
std::once_flag g_init_once;
int g_provided = -1;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !g_mpi_failed.load()) MPI_Finalize();
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

void ensure_initialized() {
  std::call_once(g_init_once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &g_provided);
      if (rc != MPI_SUCCESS) throw CommError(fmt::format("MPI_Init_thread failed: {}", mpi_error_string(rc)));
      std::atexit(finalize_at_exit);
    } else {
      MPI_Query_thread(&g_provided);
    }
  });
}

template <typename ToFloat, typename FromFloat>
void half_sum(void* in, void* inout, int* len, ToFloat to_float, FromFloat from_float) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = from_float(to_float(a[i]) + to_float(b[i]));
}

void f16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  int i = 0;
#if defined(__F16C__) && defined(__AVX__)
  // Hardware conversions (IEEE round to nearest even, like kernels/half_ops.cuh) 8 values at a time.
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (; i + 8 <= *len; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + i),
                     _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  int rest = *len - i;
  half_sum(static_cast<std::uint16_t*>(in) + i, static_cast<std::uint16_t*>(inout) + i, &rest,
           kernels::half_bits_to_float, kernels::float_to_half_bits);
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  half_sum(in, inout, len, kernels::bf16_bits_to_float, kernels::float_to_bf16_bits);
}

MPI_Op half_op(DType dtype) {
  static MPI_Op f16 = MPI_OP_NULL, bf16 = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Op_create(&f16_sum, 1, &f16);
    MPI_Op_create(&bf16_sum, 1, &bf16);
  });
  return dtype == DType::kF16 ? f16 : bf16;
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT32_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kF16:
    case DType::kBF16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

int to_int(std::size_t value, std::string_view what, int rank) {
  GRADCOMP_CHECK(value <= static_cast<std::size_t>(INT_MAX),
                 "mpi communicator (rank {}): {} of {} exceeds MPI's int count limit", rank, what, value);
  return static_cast<int>(value);
}

// A non-null address for zero-length buffers (MPI implementations may reject null with a non-zero type size).
void* nonnull(void* data) {
  static std::byte dummy[16];
  return data != nullptr ? data : dummy;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    cuda_aware_ = MPIX_Query_cuda_support() == 1;
#endif
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !broken_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override {
    GRADCOMP_CHECK(timeout.count() > 0, "mpi communicator: timeout must be positive, got {} ms", timeout.count());
    timeout_ = timeout;
  }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    comm::check_reduce(inout.dtype(), op, "mpi", rank_);
    if (inout.device().is_cuda() && !cuda_aware_) {
      comm::HostStage stage(inout);
      allreduce(stage.host_view(), op);
      stage.copy_back();
      return;
    }
    const int count = to_int(inout.numel(), "allreduce element count", rank_);
    MPI_Op mpi_op = MPI_SUM;
    if (inout.dtype() == DType::kF16 || inout.dtype() == DType::kBF16) {
      mpi_op = half_op(inout.dtype());
    } else if (op == ReduceOp::kMax) {
      mpi_op = MPI_MAX;
    } else if (op == ReduceOp::kMin) {
      mpi_op = MPI_MIN;
    }
    // Not MPI_IN_PLACE: Open MPI's libnbc then only uses its binomial reduce+broadcast (the root does all the
    // reduction work); with a separate send buffer large messages get the ring.
    send_copy_.assign(static_cast<const std::byte*>(inout.data()),
                      static_cast<const std::byte*>(inout.data()) + inout.bytes());
    MPI_Request request;
    check(MPI_Iallreduce(nonnull(send_copy_.data()), nonnull(inout.data()), count, mpi_type(inout.dtype()), mpi_op,
                         comm_, &request),
          "MPI_Iallreduce", inout.bytes());
    wait(request, "allreduce", inout.bytes());
    if (op == ReduceOp::kAverage) comm::divide_by(inout.data(), inout.numel(), inout.dtype(), size_);
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    GRADCOMP_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size_),
                   "mpi communicator: allgather on rank {} needs a receive buffer of {} x {} bytes, got {}", rank_,
                   size_, send.size(), recv.size());
    comm::SpanStage stage(send, recv, cuda_aware_);
    const int count = to_int(send.size(), "allgather bytes", rank_);
    MPI_Request request;
    check(MPI_Iallgather(nonnull(const_cast<std::byte*>(stage.send().data())), count, MPI_BYTE,
                         nonnull(stage.recv().data()), count, MPI_BYTE, comm_, &request),
          "MPI_Iallgather", send.size());
    wait(request, "allgather", recv.size());
    stage.copy_back();
  }

  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv) override {
    std::vector<int> counts, displs;
    to_counts(recv_counts, recv.size(), counts, displs, "allgatherv");
    GRADCOMP_CHECK(recv_counts[rank_] == send.size(),
                   "mpi communicator: allgatherv on rank {} sends {} bytes but recv_counts[{}] = {}", rank_,
                   send.size(), rank_, recv_counts[rank_]);
    comm::SpanStage stage(send, recv, cuda_aware_);
    MPI_Request request;
    check(MPI_Iallgatherv(nonnull(const_cast<std::byte*>(stage.send().data())), counts[rank_], MPI_BYTE,
                          nonnull(stage.recv().data()), counts.data(), displs.data(), MPI_BYTE, comm_, &request),
          "MPI_Iallgatherv", send.size());
    wait(request, "allgatherv", recv.size());
    stage.copy_back();
  }

  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    std::vector<int> scounts, sdispls, rcounts, rdispls;
    to_counts(send_counts, send.size(), scounts, sdispls, "alltoallv (send)");
    to_counts(recv_counts, recv.size(), rcounts, rdispls, "alltoallv (receive)");
    comm::SpanStage stage(send, recv, cuda_aware_);
    MPI_Request request;
    check(MPI_Ialltoallv(nonnull(const_cast<std::byte*>(stage.send().data())), scounts.data(), sdispls.data(),
                         MPI_BYTE, nonnull(stage.recv().data()), rcounts.data(), rdispls.data(), MPI_BYTE, comm_,
                         &request),
          "MPI_Ialltoallv", send.size());
    wait(request, "alltoallv", send.size() + recv.size());
    stage.copy_back();
  }

  void broadcast(std::span<std::byte> buffer, int root) override {
    GRADCOMP_CHECK(root >= 0 && root < size_, "mpi communicator: broadcast root {} out of range [0, {})", root, size_);
    comm::SpanStage stage({buffer.data(), buffer.size()}, buffer, cuda_aware_);
    MPI_Request request;
    check(MPI_Ibcast(nonnull(stage.recv().data()), to_int(buffer.size(), "broadcast bytes", rank_), MPI_BYTE, root,
                     comm_, &request),
          "MPI_Ibcast", buffer.size());
    wait(request, "broadcast", buffer.size());
    stage.copy_back();
  }

  void barrier() override {
    MPI_Request request;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", 0);
    wait(request, "barrier", 0);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    // MPI_Comm_split blocks without a deadline; a timed allgather first proves every rank has arrived.
    std::int32_t mine[2] = {color, key};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size_));
    allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    MPI_Comm child = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split", 0);
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(child, timeout_);
  }

  int node_color() override {
    if (node_color_) return *node_color_;
    if (const auto local = comm::local_size_from_env()) {
      node_color_ = rank_ / *local;
      return *node_color_;
    }
    barrier();  // MPI_Comm_split_type blocks: make sure everybody is here first
    MPI_Comm shared = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared), "MPI_Comm_split_type", 0);
    MpiCommunicator node(shared, timeout_);
    std::int32_t leader = rank_;
    node.broadcast(std::as_writable_bytes(std::span(&leader, 1)), 0);
    node_color_ = leader;
    return leader;
  }

 private:
  void check(int rc, std::string_view call, std::size_t bytes) {
    if (rc == MPI_SUCCESS) return;
    broken_ = true;
    g_mpi_failed = true;
    throw CommError(fmt::format("mpi communicator: {} failed on rank {} of {} ({} bytes): {}", call, rank_, size_,
                                bytes, mpi_error_string(rc)));
  }

  // Completes `request` by polling MPI_Test until the deadline.
  void wait(MPI_Request& request, std::string_view op, std::size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    for (unsigned spins = 0;; ++spins) {
      int done = 0;
      MPI_Status status;
      const int rc = MPI_Test(&request, &done, &status);
      if (rc != MPI_SUCCESS) check(rc, fmt::format("{} (MPI_Test)", op), bytes);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        broken_ = true;
        g_mpi_failed = true;
        throw Timeout(fmt::format("mpi communicator: {} of {} bytes timed out on rank {} of {} after {} ms (limit {} "
                                  "ms): a peer rank is missing, dead or stuck",
                                  op, bytes, rank_, size_, comm::ms_since(start), timeout_.count()));
      }
      // Spin briefly for latency, yield, then nap: 20 us naps for the first ~40 ms, 200 us naps after that. Ranks
      // that share cores (oversubscribed runs) need the CPU for their own reductions and compression. Yielding up to
      // 4096 times and then napping 20 us for the whole wait cost a waiting thread tens of thousands of wake-ups a
      // second (measured: 4 ranks whose idle fusion runtimes sat in their negotiation allgather burnt 0.4-1.4 CPU-s
      // per 5 s each on 2 cores); a 200 us nap still polls the TCP progress engine often enough to keep a 1 Gbit/s
      // link's socket buffers (25 KB per nap) moving.
      if (spins > 192) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } else if (spins > 128) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      } else if (spins > 64) {
        std::this_thread::yield();
      }
    }
  }

  void to_counts(std::span<const std::size_t> counts, std::size_t total, std::vector<int>& out,
                 std::vector<int>& displs, std::string_view what) const {
    GRADCOMP_CHECK(counts.size() == static_cast<std::size_t>(size_),
                   "mpi communicator: {} on rank {} needs {} counts, got {}", what, rank_, size_, counts.size());
    const std::size_t sum = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    GRADCOMP_CHECK(sum == total, "mpi communicator: {} on rank {}: counts add up to {} bytes, buffer has {}", what,
                   rank_, sum, total);
    to_int(sum, fmt::format("{} total bytes", what), rank_);
    out.resize(counts.size());
    displs.resize(counts.size());
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      out[r] = static_cast<int>(counts[r]);
      displs[r] = static_cast<int>(offset);
      offset += counts[r];
    }
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  bool broken_ = false;
  bool cuda_aware_ = false;
  std::optional<int> node_color_;
  std::vector<std::byte> send_copy_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(const MpiOptions& options) {
  GRADCOMP_CHECK(options.timeout.count() > 0, "make_mpi_world_communicator: timeout must be positive, got {} ms",
                 options.timeout.count());
  ensure_initialized();
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi_error_string(rc)));
  return std::make_unique<MpiCommunicator>(world, options.timeout);
}

std::string mpi_thread_level() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return "none";
  int provided = g_provided;
  if (provided < 0) MPI_Query_thread(&provided);
  switch (provided) {
    case MPI_THREAD_SINGLE: return "single";
    case MPI_THREAD_FUNNELED: return "funneled";
    case MPI_THREAD_SERIALIZED: return "serialized";
    case MPI_THREAD_MULTIPLE: return "multiple";
  }
  return fmt::format("unknown ({})", provided);
}

}  // namespace gradcomp
