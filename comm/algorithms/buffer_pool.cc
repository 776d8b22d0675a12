#include "comm/algorithms/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <limits>

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

namespace {

// The smallest block of `device` among `blocks` with capacity in [at_least, at_most], or blocks.end().
std::vector<PooledBlock>::iterator best_fit(std::vector<PooledBlock>& blocks, int device, std::size_t at_least,
                                            std::size_t at_most) {
  auto best = blocks.end();
  for (auto it = blocks.begin(); it != blocks.end(); ++it) {
    if (it->device == device && it->capacity >= at_least && it->capacity <= at_most &&
        (best == blocks.end() || it->capacity < best->capacity)) {
      best = it;
    }
  }
  return best;
}

PooledBlock take(std::vector<PooledBlock>& blocks, std::vector<PooledBlock>::iterator it) {
  const PooledBlock block = *it;
  blocks.erase(it);
  return block;
}

}  // namespace

PooledBlock BlockPool::acquire(std::size_t bytes, int device) {
  const std::size_t capacity = pooled_capacity(bytes);
  if (capacity < kMinPooledBytes) {
    for (auto it = small_.rbegin(); it != small_.rend(); ++it) {
      if (it->device == device && it->capacity == capacity) return take(small_, std::next(it).base());
    }
  } else if (auto fit = best_fit(blocks_, device, capacity, 2 * capacity); fit != blocks_.end()) {
    return take(blocks_, fit);
  }
  // Nothing of the request's class (or within 2x): any larger cached block rather than new memory. Buffers of one
  // step vary in size when the runtime groups tensors differently (cycle timing), and a smaller one must not
  // allocate after a larger one came back: that kept the first device run's steady state allocating.
  const std::size_t any = std::numeric_limits<std::size_t>::max();
  if (auto fit = best_fit(small_, device, capacity + 1, any); fit != small_.end()) return take(small_, fit);
  if (auto fit = best_fit(blocks_, device, capacity, any); fit != blocks_.end()) return take(blocks_, fit);
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
