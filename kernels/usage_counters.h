// Per-thread counts of what the hot path must not do in steady state: allocate working memory (a pool miss, a
// cudaMalloc/cudaMallocHost of a workspace that grows) and make the host wait for a device stream. Every place in the
// library that does either notes it here; compressed_allreduce reports the difference over one call in
// AllreduceStats::allocations and ::synchronizations, so tests can assert "none after warm-up" on any path. Per
// thread, so ranks running as threads of one process (tests, the local communicator) do not see each other's counts.
#pragma once

#include <cstddef>

namespace gradcomp::kernels {

struct UsageCounts {
  std::size_t allocations = 0;      // blocks of working memory obtained from the system (host or device)
  std::size_t synchronizations = 0; // host waits for a device stream (counted on the host path too: see memory_space)
};

// The calling thread's running counts.
inline UsageCounts& thread_usage() {
  thread_local UsageCounts counts;
  return counts;
}

inline void note_allocation() { ++thread_usage().allocations; }
inline void note_synchronization() { ++thread_usage().synchronizations; }

}  // namespace gradcomp::kernels
