#include "comm/algorithms/buffer_pool.h"

#include <algorithm>
#include <vector>

namespace gradcomp::algorithms {
namespace {
std::vector<PooledBlock>& cache() {
  thread_local std::vector<PooledBlock> blocks;
  return blocks;
}
}  // namespace

PooledBlock acquire_block(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  if (bytes >= kMinPooledBytes) {
    auto& blocks = cache();
    auto best = blocks.end();
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      if (it->capacity >= bytes && it->capacity <= 2 * bytes && (best == blocks.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != blocks.end()) {
      PooledBlock block = std::move(*best);
      blocks.erase(best);
      return block;
    }
  }
  return PooledBlock{std::unique_ptr<std::byte[]>(new std::byte[bytes]), bytes};
}

void release_block(PooledBlock block) {
  if (!block.data || block.capacity < kMinPooledBytes) return;
  auto& blocks = cache();
  blocks.push_back(std::move(block));
  if (blocks.size() > kMaxPooledBlocks) {
    const auto smallest = std::min_element(blocks.begin(), blocks.end(),
                                           [](const auto& a, const auto& b) { return a.capacity < b.capacity; });
    blocks.erase(smallest);
  }
}

}  // namespace gradcomp::algorithms
