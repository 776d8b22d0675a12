// Random-k's positions on the device are decided element by element (kernels/randomk_ops.cuh) instead of by Floyd's
// sequential pass: this runs that very pipeline on the host (the draws, a stable sort by value, one decision per
// candidate, the picked candidates in order: what kernels/randomk_cuda.cu does with CUB) and compares it with the
// CPU codec's randomk_indices() bit for bit, over sizes, ratios, seeds and steps, the edge cases k = 1, k = n - 1,
// k = n and chains of collisions (k close to n) included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "compressors/codecs/randomk.h"
#include "kernels/randomk_ops.cuh"

namespace gradcomp {
namespace {

std::vector<std::uint32_t> parallel_indices(std::uint64_t seed, std::uint64_t key, std::uint64_t step, std::uint64_t n,
                                            std::uint64_t k) {
  kernels::FloydDraws d;
  d.n = n;
  d.k = k;
  d.stream = kernels::randomk_stream(seed, key, step);
  std::vector<std::uint32_t> values(k), steps(k);
  for (std::uint64_t i = 0; i < k; ++i) {
    steps[i] = static_cast<std::uint32_t>(n - k + i);
    values[i] = static_cast<std::uint32_t>(kernels::floyd_draw(d, n - k + i));
  }
  std::vector<std::size_t> order(k);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
  std::vector<std::uint32_t> sorted_values(k), sorted_steps(k);
  for (std::size_t i = 0; i < k; ++i) {
    sorted_values[i] = values[order[i]];
    sorted_steps[i] = steps[order[i]];
  }
  d.values = sorted_values.data();
  d.steps = sorted_steps.data();
  std::vector<std::uint32_t> picked;
  for (std::uint64_t c = 0; c < 2 * k; ++c) {
    std::uint32_t item = 0;
    if (kernels::floyd_candidate_picked(d, c, item)) picked.push_back(item);
  }
  return picked;
}

TEST(RandomKParallel, PicksExactlyFloydsPositions) {
  std::size_t cases = 0;
  for (const std::uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 100ull, 1000ull, 4096ull, 100003ull}) {
    std::vector<std::uint64_t> ks = {1, n / 100, n / 10, n / 3, n / 2, n - n / 4, n - 1, n};
    for (const std::uint64_t k : ks) {
      if (k == 0 || k > n) continue;
      for (const std::uint64_t seed : {0ull, 3ull}) {
        for (const std::uint64_t step : {0ull, 1ull, 977ull}) {
          const std::uint64_t key = 0x9e3779b97f4a7c15ull * (n + 1) ^ step;
          std::vector<std::uint32_t> floyd;
          randomk_indices(seed, key, step, n, k, floyd);
          const std::vector<std::uint32_t> parallel = parallel_indices(seed, key, step, n, k);
          ASSERT_EQ(parallel, floyd) << fmt::format("n {} k {} seed {} step {}", n, k, seed, step);
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 300u);
}

}  // namespace
}  // namespace gradcomp
