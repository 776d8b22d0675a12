#include "comm/mpi/mpi_support.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/communicator.h"
#include "kernels/half_ops.cuh"
#include "src/core/env.h"

namespace gradcomp::mpi {
namespace {

std::atomic<bool> g_failed{false};
std::once_flag g_init_once;
int g_provided = -1;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !g_failed.load()) MPI_Finalize();
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

}  // namespace

void ensure_initialized() {
  std::call_once(g_init_once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &g_provided);
      if (rc != MPI_SUCCESS) throw CommError(fmt::format("MPI_Init_thread failed: {}", error_string(rc)));
      // Open MPI reports an error of a non-blocking collective's request (a peer that sent more than this rank
      // posted: MPI_ERR_TRUNCATE) through MPI_COMM_WORLD's handler, not the request's communicator's: with the default
      // MPI_ERRORS_ARE_FATAL that aborts the job instead of becoming a CommError that names the operation. When
      // MPI is the user's (initialized before us), the handler is theirs to choose (mpi4py sets this one too).
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      std::atexit(finalize_at_exit);
    } else {
      MPI_Query_thread(&g_provided);
    }
  });
}

int provided_thread_level() { return g_provided; }

void note_failure() { g_failed = true; }

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT32_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kF16:
    case DType::kBF16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op half_sum_op(DType dtype) {
  static MPI_Op f16 = MPI_OP_NULL, bf16 = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Op_create(&f16_sum, 1, &f16);
    MPI_Op_create(&bf16_sum, 1, &bf16);
  });
  return dtype == DType::kF16 ? f16 : bf16;
}

MPI_Op reduce_op(DType dtype, ReduceOp op) {
  if (op == ReduceOp::kMax) return MPI_MAX;
  if (op == ReduceOp::kMin) return MPI_MIN;
  return dtype == DType::kF16 || dtype == DType::kBF16 ? half_sum_op(dtype) : MPI_SUM;
}

bool ring_suits(Communicator& comm) {
  const std::int32_t mine = comm.node_color();
  std::vector<std::int32_t> colors(static_cast<std::size_t>(comm.size()));
  comm.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(colors)), Memory::host());
  std::sort(colors.begin(), colors.end());
  const auto nodes = static_cast<std::size_t>(std::unique(colors.begin(), colors.end()) - colors.begin());
  return nodes == 1 || nodes == colors.size();
}

int to_int(std::size_t value, std::string_view what, int rank) {
  GRADCOMP_CHECK(value <= static_cast<std::size_t>(INT_MAX),
                 "mpi communicator (rank {}): {} of {} exceeds MPI's int count limit", rank, what, value);
  return static_cast<int>(value);
}

void* nonnull(void* data) {
  static std::byte dummy[16];
  return data != nullptr ? data : dummy;
}

void to_counts(std::span<const std::size_t> counts, std::size_t total, std::vector<int>& out, std::vector<int>& displs,
               std::string_view what, int rank, int size, bool as_ints) {
  GRADCOMP_CHECK(counts.size() == static_cast<std::size_t>(size),
                 "mpi communicator: {} on rank {} needs {} counts, got {}", what, rank, size, counts.size());
  const std::size_t sum = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  GRADCOMP_CHECK(sum == total, "mpi communicator: {} on rank {}: counts add up to {} bytes, buffer has {}", what,
                 rank, sum, total);
  if (!as_ints) return;  // the caller goes in rounds (comm/mpi/mpi_gather_rounds.h)
  to_int(sum, fmt::format("{} total bytes", what), rank);
  out.resize(counts.size());
  displs.resize(counts.size());
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    out[r] = static_cast<int>(counts[r]);
    displs[r] = static_cast<int>(offset);
    offset += counts[r];
  }
}

void back_off(unsigned spins) {
  if (spins > 192) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  } else if (spins > 128) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  } else if (spins > 64) {
    std::this_thread::yield();
  }
}

std::size_t max_message_bytes() {
  const auto bytes = env::integer("GRADCOMP_MPI_MAX_MESSAGE_BYTES", 1, INT_MAX, "bytes");
  return bytes ? static_cast<std::size_t>(*bytes) : std::size_t{1} << 30;
}

std::size_t ring_min_bytes_from_env() {
  constexpr std::size_t kDefault = std::size_t{1} << 20;
  const auto text = env::text("GRADCOMP_MPI_RING_MIN_BYTES");
  if (!text) return kDefault;
  if (*text == "off") return std::numeric_limits<std::size_t>::max();
  const auto bytes = env::integer("GRADCOMP_MPI_RING_MIN_BYTES", 0, std::numeric_limits<long long>::max(),
                                  "bytes (or 'off')");
  return static_cast<std::size_t>(*bytes);
}

}  // namespace gradcomp::mpi

namespace gradcomp {

std::string mpi_thread_level() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return "none";
  int provided = mpi::provided_thread_level();
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
