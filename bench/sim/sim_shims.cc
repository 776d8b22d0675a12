// What the simulated build (bench/sim) replaces under gradcomp's unchanged code. The object is linked with -Bsymbolic,
// so these definitions bind gradcomp's own calls and nothing else in the process (SimGrid keeps its own).
//
//   - std::chrono::steady_clock::now(): the simulated clock (SMPI's clock_gettime: it first charges the computation
//     since the last MPI call, then reads simulated time). Every timer of gradcomp — the harness's time per call, the
//     algorithms' compress/communicate/decompress split, learn_links' probes, the communicators' deadlines — then
//     measures simulated seconds.
//   - std::thread::hardware_concurrency(): 1. A simulated rank is one core; SMPI measures the CPU time of the rank's
//     own thread, so codec worker threads would run uncharged.
//   - MPI_Iallreduce, MPI_Iallgather(v), MPI_Ialltoallv, MPI_Ibcast, MPI_Ibarrier: their blocking forms, completed
//     at once (the request is MPI_REQUEST_NULL). SMPI implements the non-blocking collectives naively (every rank
//     sends its whole buffer to every other: an Iallreduce of 100 MB on 1,024 ranks moves 100 GB per rank), while its
//     blocking collectives follow Open MPI's or MPICH's algorithm selection (--cfg=smpi/coll-selector:ompi).
//   - MPI_Test: of MPI_REQUEST_NULL reports completion, as the MPI standard says. SMPI 3.32 leaves `flag` untouched
//     when the status is MPI_STATUS_IGNORE, so the ring (comm/mpi/mpi_ring.cc), which tests a receive that its
//     blocking wait already completed, waited forever.
//   - operator new/delete: allocations of at least GRADCOMP_SIM_SHARED_BYTES bytes (unset or 0: none) come from
//     SMPI_SHARED_MALLOC, one folded block of memory that every rank shares (see docs/scaling.md: contents are
//     garbage, which only the modeled codecs of sim_modeled_codec.cc may be run on). This is what lets 1,024 ranks
//     of 100 MB gradients fit in memory.
//   - With those folded buffers on: memcpy/memmove into a folded buffer of at least that size do nothing (their bytes
//     are garbage either way, as SMPI skips copying messages between folded buffers), and the harness's
//     fill_gradient() leaves a folded gradient as it is. Without them 1,024 ranks spend minutes copying garbage.
#include <dlfcn.h>
#include <mpi.h>
#include <smpi/smpi.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <new>
#include <thread>
#include <utility>
#include <vector>

namespace std::chrono {
inline namespace _V2 {
steady_clock::time_point steady_clock::now() noexcept {
  timespec now{};
  smpi_clock_gettime(CLOCK_MONOTONIC, &now);
  return time_point(duration_cast<duration>(seconds(now.tv_sec) + nanoseconds(now.tv_nsec)));
}
}  // namespace _V2
}  // namespace std::chrono

unsigned int std::thread::hardware_concurrency() noexcept { return 1; }

extern "C" {

int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (request != nullptr && flag != nullptr && *request == MPI_REQUEST_NULL) {
    *flag = 1;
    if (status != MPI_STATUS_IGNORE) PMPI_Test(request, flag, status);  // fills the empty status
    return MPI_SUCCESS;
  }
  return PMPI_Test(request, flag, status);
}

int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}

int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                   MPI_Datatype recv_type, MPI_Comm comm, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return PMPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
}

int MPI_Iallgatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv, const int* recv_counts,
                    const int* displs, MPI_Datatype recv_type, MPI_Comm comm, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return PMPI_Allgatherv(send, send_count, send_type, recv, recv_counts, displs, recv_type, comm);
}

int MPI_Ialltoallv(const void* send, const int* send_counts, const int* send_displs, MPI_Datatype send_type,
                   void* recv, const int* recv_counts, const int* recv_displs, MPI_Datatype recv_type, MPI_Comm comm,
                   MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return PMPI_Alltoallv(send, send_counts, send_displs, send_type, recv, recv_counts, recv_displs, recv_type, comm);
}

int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return PMPI_Bcast(buffer, count, type, root, comm);
}

int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return PMPI_Barrier(comm);
}

}  // extern "C"

namespace {

std::size_t shared_threshold();

// Whether `p` lies in a folded (shared) allocation of at least `bytes`.
bool folded(const void* p, std::size_t bytes) {
  const std::size_t threshold = shared_threshold();
  if (threshold == 0 || bytes < threshold) return false;
  std::vector<std::pair<std::size_t, std::size_t>> private_blocks;
  std::size_t offset = 0;
  return smpi_is_shared(p, private_blocks, &offset) != 0 && private_blocks.empty();
}

std::size_t shared_threshold() {
  static const std::size_t bytes = [] {
    const char* text = std::getenv("GRADCOMP_SIM_SHARED_BYTES");
    return text == nullptr ? std::size_t{0} : static_cast<std::size_t>(std::strtoull(text, nullptr, 10));
  }();
  return bytes;
}

void* allocate(std::size_t bytes) {
  const std::size_t threshold = shared_threshold();
  void* p = threshold > 0 && bytes >= threshold ? SMPI_SHARED_MALLOC(bytes) : std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void release(void* p) {
  if (p == nullptr) return;
  if (shared_threshold() > 0) {
    SMPI_SHARED_FREE(p);  // plain free() for what it did not allocate
  } else {
    std::free(p);
  }
}

}  // namespace

void* operator new(std::size_t bytes) { return allocate(bytes); }
void* operator new[](std::size_t bytes) { return allocate(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return allocate(bytes);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept { return operator new(bytes, tag); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }

namespace {
using CopyFn = void* (*)(void*, const void*, std::size_t);
CopyFn g_memcpy = nullptr, g_memmove = nullptr;
__attribute__((constructor)) void resolve_copies() {
  g_memcpy = reinterpret_cast<CopyFn>(dlsym(RTLD_NEXT, "memcpy"));
  g_memmove = reinterpret_cast<CopyFn>(dlsym(RTLD_NEXT, "memmove"));
}
// Before resolve_copies() ran (the loader's own copies): one byte at a time (this file is compiled without
// loop-to-memcpy idiom recognition).
void* copy_bytes(void* to, const void* from, std::size_t n, bool overlap) {
  auto* d = static_cast<volatile unsigned char*>(to);
  const auto* s = static_cast<const unsigned char*>(from);
  if (overlap && d > s) {
    for (std::size_t i = n; i > 0; --i) d[i - 1] = s[i - 1];
  } else {
    for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
  }
  return to;
}
}  // namespace

extern "C" void* memcpy(void* to, const void* from, std::size_t n) noexcept {
  if (folded(to, n)) return to;
  return g_memcpy != nullptr ? g_memcpy(to, from, n) : copy_bytes(to, from, n, false);
}

extern "C" void* memmove(void* to, const void* from, std::size_t n) noexcept {
  if (folded(to, n)) return to;
  return g_memmove != nullptr ? g_memmove(to, from, n) : copy_bytes(to, from, n, true);
}

namespace gradcomp::perf {
void fill_gradient_real(std::vector<float>& values, int rank);  // bench/comm/perf/perf_reference.cc, renamed
void fill_gradient(std::vector<float>& values, int rank) {
  if (folded(values.data(), values.size() * sizeof(float))) return;
  fill_gradient_real(values, rank);
}
}  // namespace gradcomp::perf
