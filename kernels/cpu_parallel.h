// Deterministic CPU parallelism: work is cut into fixed-size chunks that do not depend on the thread count, so any
// per-chunk partial result (and its reduction order) is identical for 1 or N threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace gradcomp::kernels {

// 0 -> all hardware threads; otherwise max(1, requested). The hardware count is read once per process: glibc
// answers std::thread::hardware_concurrency() by opening /sys/devices/system/cpu/online, which cost a small
// tensor's codec call more than its arithmetic.
inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  static const int hardware = [] {
    const unsigned count = std::thread::hardware_concurrency();
    return count == 0 ? 1 : static_cast<int>(count);
  }();
  return hardware;
}

// Calls fn(chunk_index, begin, end) for every chunk [k*chunk, min(n, (k+1)*chunk)) of [0, n), spread over up to
// `threads` threads (serial when there is one chunk or one thread). Exceptions from fn are rethrown in the caller.
template <typename Fn>
void parallel_chunks(std::size_t n, std::size_t chunk, int threads, Fn&& fn) {
  if (n == 0) return;
  chunk = std::max<std::size_t>(chunk, 1);
  const std::size_t chunks = (n + chunk - 1) / chunk;
  const std::size_t workers =
      chunks == 1 ? 1 : std::min<std::size_t>(chunks, static_cast<std::size_t>(resolve_threads(threads)));
  if (workers <= 1) {
    for (std::size_t k = 0; k < chunks; ++k) fn(k, k * chunk, std::min(n, (k + 1) * chunk));
    return;
  }
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto run = [&](std::size_t worker) {
    try {
      for (std::size_t k = worker; k < chunks; k += workers) fn(k, k * chunk, std::min(n, (k + 1) * chunk));
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

// Element chunk used for parallel loops over large tensors (elements; a multiple of every bucket size in use).
inline constexpr std::size_t kParallelChunk = std::size_t{1} << 16;

}  // namespace gradcomp::kernels
