// Reuse of large payload buffers across compressed_allreduce calls. A fresh multi-megabyte allocation is served by
// mmap and every page faults (and is zeroed by the kernel) on first touch: for a 64 MiB fusion buffer that costs
// more than compressing it with `none`. Freed blocks of at least kMinPooledBytes go to a small per-thread cache and
// serve later requests of up to their capacity. Per thread, so no locking; bounded, so memory stays predictable.
#pragma once

#include <cstddef>
#include <memory>

namespace gradcomp::algorithms {

// Blocks smaller than this are plain new[]/delete[] (malloc reuses them well).
inline constexpr std::size_t kMinPooledBytes = std::size_t{1} << 20;
// Blocks a thread keeps at most; beyond that the smallest is freed.
inline constexpr std::size_t kMaxPooledBlocks = 4;

struct PooledBlock {
  std::unique_ptr<std::byte[]> data;
  std::size_t capacity = 0;
};

// A block of at least `bytes` (contents unspecified): a cached one when one fits within 2x, else a new one.
PooledBlock acquire_block(std::size_t bytes);
// Returns a block to this thread's cache (or frees it).
void release_block(PooledBlock block);

}  // namespace gradcomp::algorithms
