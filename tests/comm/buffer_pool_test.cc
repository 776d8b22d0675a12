// The one pool of reusable working buffers (comm/algorithms/buffer_pool.h), used by the host and CUDA memory spaces
// and the runtime's fusion buffers: reuse within 2x first, then any larger block, per-device keys, size classes of
// small blocks, the bounds.
#include "comm/algorithms/buffer_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "comm/algorithms/memory_space.h"

namespace gradcomp::algorithms {
namespace {

// Allocations and frees of a fake kind of memory, to see what the pool asks of its allocator.
struct Counts {
  int allocated = 0;
  int freed = 0;
  std::set<std::byte*> live;
};
Counts counts;

BlockPool make_pool() {
  counts = Counts{};
  return BlockPool(BlockAllocator{
      [](std::size_t bytes, int) {
        auto* data = new std::byte[bytes];
        ++counts.allocated;
        counts.live.insert(data);
        return data;
      },
      [](std::byte* data, int) {
        EXPECT_EQ(counts.live.erase(data), 1u) << "freed a block the allocator did not hand out, or twice";
        ++counts.freed;
        delete[] data;
      }});
}

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(BlockPool, ReusesAFreedBlockWithinTwiceTheRequestFirst) {
  {
    BlockPool pool = make_pool();
    const PooledBlock first = pool.acquire(4 * kMiB);
    const PooledBlock big = pool.acquire(16 * kMiB);
    pool.release(first);
    pool.release(big);
    EXPECT_EQ(pool.cached(), 2u);
    const PooledBlock again = pool.acquire(3 * kMiB);  // 4 MiB <= 2 x 3 MiB: the best fit
    EXPECT_EQ(again.data, first.data);
    EXPECT_EQ(again.capacity, 4 * kMiB);
    pool.release(again);
    EXPECT_EQ(pool.acquire(9 * kMiB).data, big.data) << "16 MiB is within 2x of 9 MiB, 4 MiB too small";
    EXPECT_EQ(counts.allocated, 2);
    pool.release(big);
  }
  EXPECT_EQ(counts.freed, 2) << "the pool frees what it caches when it goes away";
  EXPECT_TRUE(counts.live.empty());
}

// Buffers shrink when the runtime groups a step's tensors differently: a smaller request after a larger one takes
// the smallest larger cached block (large or small) rather than new memory; only an empty cache allocates.
TEST(BlockPool, ASmallerRequestAfterALargerOneAllocatesNothing) {
  {
    BlockPool pool = make_pool();
    const PooledBlock first = pool.acquire(4 * kMiB);
    const PooledBlock big = pool.acquire(66 * kMiB);
    const PooledBlock medium = pool.acquire(1000);  // the 1 KiB class
    pool.release(first);
    pool.release(big);
    pool.release(medium);
    const PooledBlock a = pool.acquire(kMiB);  // nothing within 2x of 1 MiB: the 4 MiB block
    EXPECT_EQ(a.data, first.data);
    const PooledBlock b = pool.acquire(kMiB + 1);
    EXPECT_EQ(b.data, big.data) << "the next larger cached block";
    const PooledBlock c = pool.acquire(300);  // the 512-byte class is empty: the 1 KiB block
    EXPECT_EQ(c.data, medium.data);
    EXPECT_EQ(counts.allocated, 3);
    const PooledBlock d = pool.acquire(kMiB);  // the cache is empty now
    EXPECT_EQ(counts.allocated, 4);
    for (const PooledBlock& block : {a, b, c, d}) pool.release(block);
    EXPECT_EQ(pool.acquire(66 * kMiB).data, big.data) << "a borrowed block goes back to its own list";
    pool.release(big);
  }
  EXPECT_TRUE(counts.live.empty());
}

TEST(BlockPool, KeysBlocksByDevice) {
  BlockPool pool = make_pool();
  pool.release(pool.acquire(2 * kMiB, /*device=*/0));
  const PooledBlock other = pool.acquire(2 * kMiB, /*device=*/1);
  EXPECT_EQ(other.device, 1);
  EXPECT_EQ(counts.allocated, 2) << "a block of device 0 must not serve device 1";
  pool.release(other);
  const PooledBlock again = pool.acquire(2 * kMiB, 0);
  EXPECT_EQ(again.device, 0);
  EXPECT_EQ(counts.allocated, 2);
  pool.release(again);  // an acquired block is the caller's until released (else it leaks: LeakSanitizer saw it)
}

TEST(BlockPool, PoolsSmallBlocksBySizeClass) {
  BlockPool pool = make_pool();
  const PooledBlock counter = pool.acquire(8);  // a device counter: the smallest class
  EXPECT_EQ(counter.capacity, kMinSmallBytes);
  pool.release(counter);
  EXPECT_EQ(pool.cached(), 1u);
  const PooledBlock shared = pool.acquire(200);
  EXPECT_EQ(shared.data, counter.data) << "8 and 200 bytes share the 256-byte class";
  const PooledBlock payload = pool.acquire(1000);
  EXPECT_EQ(payload.capacity, 1024u);
  pool.release(payload);
  const PooledBlock again = pool.acquire(513);
  EXPECT_EQ(again.data, payload.data) << "a steady-state call must not allocate small blocks either";
  const PooledBlock other = pool.acquire(1025);
  EXPECT_NE(other.data, payload.data) << "another class";
  EXPECT_EQ(pool.allocations(), 3u);
  for (const PooledBlock& block : {shared, again, other}) pool.release(block);
}

TEST(BlockPool, StaysBounded) {
  BlockPool pool = make_pool();
  std::vector<PooledBlock> small;
  for (std::size_t i = 0; i < kMaxSmallPerClass + 3; ++i) small.push_back(pool.acquire(300));
  for (const PooledBlock& block : small) pool.release(block);
  EXPECT_EQ(pool.cached(), kMaxSmallPerClass);
  EXPECT_EQ(counts.freed, 3) << "a class keeps at most kMaxSmallPerClass blocks";
  std::vector<PooledBlock> blocks;
  for (std::size_t i = 0; i < kMaxPooledBlocks + 2; ++i) blocks.push_back(pool.acquire((i + 1) * 2 * kMiB));
  for (const PooledBlock& block : blocks) pool.release(block);
  EXPECT_EQ(pool.cached(), kMaxSmallPerClass + kMaxPooledBlocks);
  EXPECT_EQ(counts.freed, 5) << "the smallest large blocks go beyond the bound";
  // The largest survive: a request for the largest size is served from the cache.
  const PooledBlock largest = pool.acquire((kMaxPooledBlocks + 2) * 2 * kMiB);
  EXPECT_EQ(largest.data, blocks.back().data);
  pool.release(largest);
}

TEST(BlockPool, HostBytesGoBackToTheThreadsPool) {
  std::byte* first = nullptr;
  {
    Bytes bytes(3 * kMiB);
    first = bytes.data();
    EXPECT_EQ(bytes.size(), 3 * kMiB);
  }
  Bytes again(3 * kMiB);
  EXPECT_EQ(again.data(), first) << "a steady-state call must not allocate";
  Bytes moved = std::move(again);
  EXPECT_EQ(moved.data(), first);
  EXPECT_EQ(again.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
}

TEST(BlockPool, BytesOfAnOwnedPoolGoBackToIt) {
  BlockPool pool(host_allocator());
  std::byte* first = nullptr;
  {
    Bytes bytes(pool, 2 * kMiB);
    first = bytes.data();
  }
  EXPECT_EQ(pool.cached(), 1u);
  Bytes again(pool, 2 * kMiB);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(pool.cached(), 0u);
}

}  // namespace
}  // namespace gradcomp::algorithms
