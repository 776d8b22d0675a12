// Reuse of working buffers (payloads, gathered payloads, f32 sums, fusion buffers, small counters), on the host and
// on CUDA devices alike, so that a compressed allreduce in steady state obtains no memory from the system. A fresh
// multi-megabyte allocation is served by mmap (or cudaMalloc) and, on the host, every page faults and is zeroed by
// the kernel on first touch: for a 64 MiB fusion buffer that costs more than compressing it with `none`; a small
// cudaMalloc/cudaFree pair synchronizes the device. Freed blocks go to a per-thread cache of their kind of memory:
// blocks under kMinPooledBytes by power-of-two size class, larger ones by exact size, each served again to requests
// that fit (its own class or within 2x first, any larger block before new memory). Per thread, so no locking;
// bounded, so memory stays predictable. Every block obtained from the allocator is counted
// (kernels/usage_counters.h), which is what AllreduceStats::allocations reports.
#pragma once

#include <cstddef>
#include <vector>

namespace gradcomp::algorithms {

// Blocks smaller than this are rounded up to a power of two (at least kMinSmallBytes) and cached per size class.
inline constexpr std::size_t kMinPooledBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMinSmallBytes = 256;
// Small blocks a pool keeps per size class and device at most; beyond that a released one is freed.
inline constexpr std::size_t kMaxSmallPerClass = 8;
// Large blocks a pool keeps at most (enough for every buffer one scatter-reduce-allgather holds at once); beyond
// that the smallest is freed.
inline constexpr std::size_t kMaxPooledBlocks = 16;

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

  // A block of at least `bytes` (at least 1) on `device`, contents unspecified: below kMinPooledBytes a cached block
  // of the request's size class, else the smallest cached block of that device within 2x of the request; failing
  // that, the smallest larger cached block of that device (a smaller request after a larger one allocates nothing);
  // else a new one (counted as an allocation).
  PooledBlock acquire(std::size_t bytes, int device = -1);
  // Caches `block` (within the bounds above; the smallest large block is freed beyond kMaxPooledBlocks) or frees it.
  // A null block is ignored.
  void release(PooledBlock block);
  // Blocks held in the cache now.
  std::size_t cached() const { return blocks_.size() + small_.size(); }
  // Blocks obtained from the allocator so far.
  std::size_t allocations() const { return allocations_; }

 private:
  BlockAllocator allocator_;
  std::vector<PooledBlock> blocks_;  // large blocks
  std::vector<PooledBlock> small_;   // small blocks, any class
  std::size_t allocations_ = 0;
};

// The capacity a request of `bytes` gets from a pool: its size class below kMinPooledBytes, else `bytes` (>= 1).
std::size_t pooled_capacity(std::size_t bytes);

// How host blocks are obtained (new[] / delete[]).
BlockAllocator host_allocator();
// The calling thread's pool of host blocks.
BlockPool& host_block_pool();

}  // namespace gradcomp::algorithms
