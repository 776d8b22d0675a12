#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "compressors/codecs/randomk.h"
#include "kernels/philox_ops.cuh"
#include "kernels/sparsify_ops.cuh"
#include "sparse_test_util.h"

namespace gradcomp::testing {
namespace {

// Positions the payload transmits: where the decoded tensor is non-zero (the test gradients have no zeros).
std::vector<std::size_t> sent_positions(const std::vector<float>& decoded) {
  std::vector<std::size_t> positions;
  for (std::size_t i = 0; i < decoded.size(); ++i) {
    if (decoded[i] != 0.0f) positions.push_back(i);
  }
  return positions;
}

TEST(RandomK, IndicesAgreeBetweenIndependentInstancesWithoutBeingSent) {
  const std::size_t n = 5000;
  auto rank0 = make_compressor("randomk:ratio=0.02,seed=42");
  auto rank1 = make_compressor("randomk:ratio=0.02,seed=42");
  for (std::uint64_t step = 0; step < 4; ++step) {
    const auto p0 = compress(*rank0, make_values(n, 10 + step), "layer1.weight", step);
    const auto p1 = compress(*rank1, make_values(n, 20 + step), "layer1.weight", step);
    // Payload = header + 32-byte stream section + k values: no index is on the wire.
    EXPECT_EQ(p0.size(), payload::kHeaderBytes + 32 + 100 * sizeof(float));
    EXPECT_EQ(sent_positions(decode(*rank1, p0, n)), sent_positions(decode(*rank0, p1, n))) << step;
    EXPECT_EQ(sent_positions(decode(*rank0, p0, n)).size(), 100u);
  }
}

TEST(RandomK, IndicesDependOnStepNameAndSeed) {
  std::vector<std::uint32_t> a, b, c, d;
  const std::uint64_t key = kernels::fnv1a64("w", 1);
  randomk_indices(0, key, 0, 10000, 50, a);
  randomk_indices(0, key, 1, 10000, 50, b);
  randomk_indices(1, key, 0, 10000, 50, c);
  randomk_indices(0, key + 1, 0, 10000, 50, d);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  std::vector<std::uint32_t> again;
  randomk_indices(0, key, 0, 10000, 50, again);
  EXPECT_EQ(a, again);
  // Distinct, ascending, in range.
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<std::uint32_t>(a.begin(), a.end()).size(), 50u);
  EXPECT_LT(a.back(), 10000u);
}

// The batched (vectorized Philox) draws give exactly Floyd's algorithm over floyd_candidate(), the per-draw form the
// CUDA path and the docs describe: across several batches and for odd k.
TEST(RandomK, BatchedDrawsMatchFloydOverFloydCandidate) {
  for (const std::uint64_t k : {1ull, 7ull, 2047ull, 2048ull, 5001ull}) {
    const std::uint64_t n = 100'003;
    const auto stream = kernels::PhiloxStream::make(5, 1234 ^ kernels::kRandomKStreamSalt, 3);
    std::set<std::uint64_t> chosen;
    for (std::uint64_t j = n - k; j < n; ++j) {
      const std::uint64_t t = kernels::floyd_candidate(stream, n, k, j);
      chosen.insert(chosen.count(t) ? j : t);
    }
    std::vector<std::uint32_t> got;
    randomk_indices(5, 1234, 3, n, k, got);
    EXPECT_EQ(std::vector<std::uint32_t>(chosen.begin(), chosen.end()), got) << k;
  }
}

TEST(RandomK, SelectionIsUniform) {
  // Each position is chosen with probability k/n: over 2000 steps of n=100, k=10 every count is ~200 (binomial,
  // sd ~13.4); 5.5 sd bounds make a false failure vanishingly rare while a biased sampler (e.g. modulo bias toward
  // low indices, or never picking the last element) fails.
  std::vector<int> counts(100, 0);
  std::vector<std::uint32_t> picks;
  for (std::uint64_t step = 0; step < 2000; ++step) {
    randomk_indices(7, 99, step, 100, 10, picks);
    ASSERT_EQ(picks.size(), 10u);
    for (const auto i : picks) ++counts[i];
  }
  for (int i = 0; i < 100; ++i) {
    EXPECT_GT(counts[i], 200 - 74) << i;
    EXPECT_LT(counts[i], 200 + 74) << i;
  }
}

TEST(RandomK, ErrorFeedbackIsExact) {
  expect_exact_error_feedback("randomk:ratio=0.05", 3001, 6);
  expect_exact_error_feedback("randomk:ratio=1", 64, 2);
}

TEST(RandomK, ThreadCountIndependence) { expect_thread_independent("randomk:ratio=0.01,seed=3", 300000); }

TEST(RandomK, StateSaveLoadIsBitIdentical) { expect_state_round_trip("randomk:ratio=0.03,seed=9", 2000); }

TEST(RandomK, CorruptPayloadsAreRejected) {
  EXPECT_GT(expect_corruptions_rejected("randomk:ratio=0.05", 200), 50u);
  auto c = make_compressor("randomk:ratio=0.1");
  auto valid = compress(*c, make_values(100, 1), "c", 0);
  const payload::Header header = payload::peek_header(valid);
  auto bad_k = valid;  // k in the stream section larger than numel
  const std::uint64_t huge = 1000;
  std::memcpy(bad_k.data() + payload::section_offset(header, 0) + 24, &huge, 8);
  std::vector<float> out(100, 5.0f);
  EXPECT_THROW(c->decompress(bad_k, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite), CorruptPayload);
  EXPECT_EQ(out, std::vector<float>(100, 5.0f));
}

TEST(RandomK, TinyTensorsAndParameters) {
  expect_tiny_tensors_work("randomk");
  expect_tiny_tensors_work("randomk:ratio=1,seed=5");
  EXPECT_THROW(make_compressor("randomk:ratio=1.5"), InvalidArgument);
  EXPECT_THROW(make_compressor("randomk:seed=-1"), InvalidArgument);
  EXPECT_THROW(make_compressor("randomk:k=3"), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp::testing
