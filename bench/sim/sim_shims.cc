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
//   - operator new/delete: allocations of at least GRADCOMP_SIM_SHARED_BYTES bytes (unset or 0: none) come from
//     SMPI_SHARED_MALLOC, one folded block of memory that every rank shares (see docs/scaling.md: contents are
//     garbage, which only the modeled codecs of sim_modeled_codec.cc may be run on). This is what lets 1,024 ranks
//     of 100 MB gradients fit in memory.
#include <mpi.h>
#include <smpi/smpi.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <new>
#include <thread>

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
