#include "comm/algorithms/buffer_pool.h"

#include <algorithm>

namespace gradcomp::algorithms {

BlockPool::~BlockPool() {
  for (const PooledBlock& block : blocks_) allocator_.free(block.data, block.device);
}

PooledBlock BlockPool::acquire(std::size_t bytes, int device) {
  bytes = std::max<std::size_t>(bytes, 1);
  if (bytes >= kMinPooledBytes) {
    auto best = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->device == device && it->capacity >= bytes && it->capacity <= 2 * bytes &&
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
  return PooledBlock{allocator_.allocate(bytes, device), bytes, device};
}

void BlockPool::release(PooledBlock block) {
  if (block.data == nullptr) return;
  if (block.capacity < kMinPooledBytes) {
    allocator_.free(block.data, block.device);
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
