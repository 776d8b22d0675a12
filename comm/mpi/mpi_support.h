// comm/mpi: the MPI plumbing the communicator is built on — initialization and the exit handler, error strings,
// dtype and f16/bf16 reduction ops, int count checks. Private to comm/mpi.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstddef>
#include <span>
#include <vector>
#include <string>
#include <string_view>

#include "gradcomp/communicator.h"
#include "gradcomp/tensor.h"

namespace gradcomp::mpi {

// Built against SimGrid's SMPI (bench/sim, GRADCOMP_SIMGRID): waits block in MPI_Wait/MPI_Waitany instead of polling
// MPI_Test with naps. A simulated rank that polls advances no simulated time (or, with SMPI's injected MPI_Test time,
// advances it in artificial steps) and costs the simulator one event per poll; a blocking wait completes exactly when
// the simulated message does. No deadline applies there: SimGrid itself reports a deadlock.
#ifdef GRADCOMP_SIMGRID
inline constexpr bool kBlockingWaits = true;
#else
inline constexpr bool kBlockingWaits = false;
#endif

// Initializes MPI (MPI_THREAD_MULTIPLE requested) unless somebody already did; then MPI_Finalize runs at exit,
// unless note_failure() was called. Throws CommError when MPI_Init_thread fails.
void ensure_initialized();

// The thread level MPI provided, or -1 before ensure_initialized().
int provided_thread_level();

// Records that an MPI operation failed or was abandoned: the exit handler then skips MPI_Finalize, which could wait
// forever on a lost peer or an abandoned collective.
void note_failure();

// MPI's text for an error code.
std::string error_string(int code);

// The MPI datatype of one element of `dtype` (f16/bf16 as MPI_UINT16_T).
MPI_Datatype datatype(DType dtype);

// The user-defined commutative sum of f16 or bf16 values (added in f32, rounded to nearest even).
MPI_Op half_sum_op(DType dtype);

// The MPI op that sums (kSum, and kAverage before the caller divides), or takes the max or min of, `dtype`'s values:
// half_sum_op for f16/bf16 sums.
MPI_Op reduce_op(DType dtype, ReduceOp op);

// Whether a flat ring suits where `comm`'s ranks run: one node, or one rank per node (by every rank's node_color(),
// allgathered: collective).
bool ring_suits(Communicator& comm);

// `value` as an MPI count; throws InvalidArgument naming `what` and `rank` past INT_MAX.
int to_int(std::size_t value, std::string_view what, int rank);

// Byte counts, one per rank, as MPI counts `out` and displacements `displs` (packed in rank order). Throws
// InvalidArgument naming `what` and `rank` unless there are `size` of them adding up to `total` (within INT_MAX, and
// filling `out` and `displs`, when `as_ints`).
void to_counts(std::span<const std::size_t> counts, std::size_t total, std::vector<int>& out, std::vector<int>& displs,
               std::string_view what, int rank, int size, bool as_ints = true);

// GRADCOMP_MPI_RING_MIN_BYTES: arrays of at least this many bytes take the pipelined ring (default 1 MiB); "off":
// none do (SIZE_MAX). Throws InvalidArgument for another value.
std::size_t ring_min_bytes_from_env();

// Backs off between two polls of an MPI request after `spins` polls without progress: spins briefly for latency,
// yields, then naps (20 us for the first ~40 ms, 200 us after). Ranks that share cores (oversubscribed runs) need the
// CPU for their own reductions and compression; a 200 us nap still polls the TCP progress engine often enough to keep
// a 1 Gbit/s link's socket buffers (25 KB per nap) moving (docs/comm.md).
void back_off(unsigned spins);

// GRADCOMP_MPI_MAX_MESSAGE_BYTES: the largest piece one MPI call moves where a buffer may pass MPI's int counts (the
// broadcast, an allgatherv's rounds on the host); default 1 GiB, 1 to INT_MAX. Throws InvalidArgument for another value.
std::size_t max_message_bytes();

// A non-null address for zero-length buffers (MPI implementations may reject null with a non-zero type size).
void* nonnull(void* data);

}  // namespace gradcomp::mpi
