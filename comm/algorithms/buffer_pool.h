// Reuse of large working buffers (payloads, gathered payloads, f32 sums, fusion buffers), on the host and on CUDA
// devices alike. A fresh multi-megabyte allocation is served by mmap (or cudaMalloc) and, on the host, every page
// faults and is zeroed by the kernel on first touch: for a 64 MiB fusion buffer that costs more than compressing it
// with `none`. Freed blocks of at least kMinPooledBytes go to a small per-thread cache of their kind of memory and
// serve later requests of up to their capacity. Per thread, so no locking; bounded, so memory stays predictable.
#pragma once

#include <cstddef>
#include <vector>

namespace gradcomp::algorithms {

// Blocks smaller than this are allocated and freed directly (malloc reuses them well).
inline constexpr std::size_t kMinPooledBytes = std::size_t{1} << 20;
// Blocks a pool keeps at most; beyond that the smallest is freed.
inline constexpr std::size_t kMaxPooledBlocks = 4;

// One block of memory: `device` -1 for the host, else the CUDA device it lives on.
struct PooledBlock {
  std::byte* data = nullptr;
  std::size_t capacity = 0;
  int device = -1;
};

// How one kind of memory is obtained and given back.
struct BlockAllocator {
  std::byte* (*allocate)(std::size_t bytes, int device);
  void (*free)(std::byte* data, int device);
};

// A bounded cache of freed blocks of one kind of memory. Not thread-safe: each thread uses its own (host_block_pool(),
// and the CUDA memory space's device pool).
class BlockPool {
 public:
  explicit BlockPool(BlockAllocator allocator) : allocator_(allocator) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  // Frees the cached blocks.
  ~BlockPool();

  // A block of at least `bytes` (at least 1) on `device`, contents unspecified: the smallest cached block of that
  // device within 2x of the request, else a new one.
  PooledBlock acquire(std::size_t bytes, int device = -1);
  // Caches `block` (a block of at least kMinPooledBytes; the smallest cached one is freed beyond kMaxPooledBlocks)
  // or frees it. A null block is ignored.
  void release(PooledBlock block);
  // Blocks held in the cache now.
  std::size_t cached() const { return blocks_.size(); }

 private:
  BlockAllocator allocator_;
  std::vector<PooledBlock> blocks_;
};

// How host blocks are obtained (new[] / delete[]).
BlockAllocator host_allocator();
// The calling thread's pool of host blocks.
BlockPool& host_block_pool();

}  // namespace gradcomp::algorithms
