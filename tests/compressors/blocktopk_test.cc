#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "sparse_test_util.h"

namespace gradcomp::testing {
namespace {

// Reference: ids of the kb blocks with the largest L2 norm (f64), ties by lower id, ascending.
std::vector<std::int32_t> reference_blocks(const std::vector<float>& x, std::size_t block, std::size_t kb) {
  const std::size_t blocks = (x.size() + block - 1) / block;
  std::vector<double> norms(blocks, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) norms[i / block] += double(x[i]) * x[i];
  std::vector<std::int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return norms[a] > norms[b]; });
  order.resize(std::min(kb, blocks));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(BlockTopK, PicksTheLargestNormBlocks) {
  const std::size_t n = 10000, block = 64;  // 157 blocks, the last one has 16 elements
  auto grad = make_values(n, 21);
  // Plant blocks with clearly larger norms, including the partial last block.
  for (const std::size_t b : {3u, 77u, 156u}) {
    for (std::size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) grad[i] *= 10.0f;
  }
  auto c = make_compressor("blocktopk:ratio=0.05,block=64,ef=off");  // kb = round(0.05 * 157) = 8
  const auto payload = compress(*c, grad, "b", 0);
  const auto ids = section_ints(payload, 0);
  EXPECT_EQ(ids, reference_blocks(grad, block, 8));
  for (const std::int32_t planted : {3, 77, 156}) EXPECT_TRUE(std::count(ids.begin(), ids.end(), planted)) << planted;
  // Whole blocks are sent, values in place, nothing else.
  const auto sent = decode(*c, payload, n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool in_sent_block = std::count(ids.begin(), ids.end(), static_cast<std::int32_t>(i / block)) > 0;
    EXPECT_EQ(sent[i], in_sent_block ? grad[i] : 0.0f) << i;
  }
  EXPECT_EQ(c->last_stats().selected, 7u * 64u + 16u);
}

TEST(BlockTopK, EqualNormsPreferLowerBlockIds) {
  std::vector<float> grad(100, 1.0f);
  auto c = make_compressor("blocktopk:ratio=0.2,block=10,ef=off");  // 10 blocks, kb = 2
  EXPECT_EQ(section_ints(compress(*c, grad, "e", 0), 0), (std::vector<std::int32_t>{0, 1}));
}

TEST(BlockTopK, ErrorFeedbackIsExact) {
  expect_exact_error_feedback("blocktopk:ratio=0.1,block=16", 1000, 6);
  expect_exact_error_feedback("blocktopk:ratio=0.5,block=7", 50, 4);
}

TEST(BlockTopK, ThreadCountIndependence) { expect_thread_independent("blocktopk:ratio=0.01,block=100", 700001); }

TEST(BlockTopK, StateSaveLoadIsBitIdentical) { expect_state_round_trip("blocktopk:ratio=0.05,block=32", 3000); }

TEST(BlockTopK, CorruptPayloadsAreRejected) {
  EXPECT_GT(expect_corruptions_rejected("blocktopk:ratio=0.1,block=8", 200), 50u);
  // A block id naming the partial last block while the value section is sized for a full block is refused.
  auto c = make_compressor("blocktopk:ratio=0.01,block=8");
  std::vector<float> grad(20, 0.0f);
  grad[0] = 5.0f;  // block 0 (full, 8 values) wins
  auto payload = compress(*c, grad, "p", 0);
  const payload::Header header = payload::peek_header(payload);
  const std::int32_t last = 2;  // 20 elements, block 8: block 2 holds 4 values
  std::memcpy(payload.data() + payload::section_offset(header, 0), &last, 4);
  std::vector<float> out(20, 1.0f);
  EXPECT_THROW(c->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite), CorruptPayload);
  EXPECT_EQ(out, std::vector<float>(20, 1.0f));
}

TEST(BlockTopK, TinyTensorsAndParameters) {
  expect_tiny_tensors_work("blocktopk");
  expect_tiny_tensors_work("blocktopk:block=1");
  expect_tiny_tensors_work("blocktopk:ratio=1,block=2");
  EXPECT_THROW(make_compressor("blocktopk:block=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("blocktopk:ratio=0"), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp::testing
