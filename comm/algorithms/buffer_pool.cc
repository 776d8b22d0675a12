#include "comm/algorithms/buffer_pool.h"

#include <algorithm>
#include <bit>

#include "kernels/usage_counters.h"

namespace gradcomp::algorithms {

std::size_t pooled_capacity(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  if (bytes >= kMinPooledBytes) return bytes;
  return std::max(kMinSmallBytes, std::bit_ceil(bytes));
}

BlockPool::~BlockPool() {
  for (const PooledBlock& block : blocks_) allocator_.free(block.data, block.device);
  for (const PooledBlock& block : small_) allocator_.free(block.data, block.device);
}

PooledBlock BlockPool::acquire(std::size_t bytes, int device) {
  const std::size_t capacity = pooled_capacity(bytes);
  if (capacity < kMinPooledBytes) {
    for (auto it = small_.rbegin(); it != small_.rend(); ++it) {
      if (it->device == device && it->capacity == capacity) {
        const PooledBlock block = *it;
        small_.erase(std::next(it).base());
        return block;
      }
    }
  } else {
    auto best = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->device == device && it->capacity >= capacity && it->capacity <= 2 * capacity &&
          (best == blocks_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != blocks_.end()) {
      const PooledBlock block = *best;
      blocks_.erase(best);
      return block;
    }
  }
  PooledBlock block{allocator_.allocate(capacity, device), capacity, device};
  ++allocations_;
  kernels::note_allocation();
  return block;
}

void BlockPool::release(PooledBlock block) {
  if (block.data == nullptr) return;
  if (block.capacity < kMinPooledBytes) {
    const auto same = std::count_if(small_.begin(), small_.end(), [&](const PooledBlock& b) {
      return b.device == block.device && b.capacity == block.capacity;
    });
    if (static_cast<std::size_t>(same) >= kMaxSmallPerClass) {
      allocator_.free(block.data, block.device);
      return;
    }
    small_.push_back(block);
    return;
  }
  blocks_.push_back(block);
  if (blocks_.size() > kMaxPooledBlocks) {
    const auto smallest = std::min_element(blocks_.begin(), blocks_.end(),
                                           [](const auto& a, const auto& b) { return a.capacity < b.capacity; });
    allocator_.free(smallest->data, smallest->device);
    blocks_.erase(smallest);
  }
}

BlockAllocator host_allocator() {
  return BlockAllocator{
      [](std::size_t bytes, int) { return new std::byte[bytes]; },
      [](std::byte* data, int) { delete[] data; },
  };
}

BlockPool& host_block_pool() {
  thread_local BlockPool pool(host_allocator());
  return pool;
}

}  // namespace gradcomp::algorithms
