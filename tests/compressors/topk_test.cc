#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "compressors/framework/payload.h"
#include "kernels/half_ops.cuh"
#include "kernels/sparsify_ops.cuh"
#include "compressors/codecs/topk_select.h"
#include "sparse_test_util.h"

namespace gradcomp::testing {
namespace {

// Reference: indices of the k largest |x| by a full sort, ties broken by the lower index; returned ascending.
std::vector<std::int32_t> reference_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);  // stable: equal magnitudes keep ascending index order
  });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

// The default ratio is part of the canonical spec: "topk" and "topk:ratio=0.01" are one spec, and each loads the
// other's state.
TEST(TopK, DefaultSpellingIsTheSameSpec) {
  auto plain = make_compressor("topk");
  auto spelled = make_compressor("topk:ratio=0.01");
  EXPECT_EQ(plain->spec(), spelled->spec());
  EXPECT_NE(plain->spec().find("ratio=0.01"), std::string::npos) << plain->spec();
  EXPECT_EQ(make_compressor("topk:k=5")->spec().find("ratio"), std::string::npos) << "k alone takes no ratio";
  const auto grad = make_values(4099, 3, false);
  compress(*plain, grad, "w", 0);
  spelled->load_state(plain->save_state());
  auto fresh = make_compressor("topk");
  fresh->load_state(spelled->save_state());
  EXPECT_EQ(compress(*fresh, grad, "w", 1), compress(*plain, grad, "w", 1));
}

// Both histogram selects: the small tensors' 2,048 bins (up to kDirectSelectMax elements) and the 65,536 bins above.
TEST(TopK, EqualsFullSortWithTiesBrokenByLowerIndex) {
  for (const std::size_t n : {std::size_t{10007}, kernels::kDirectSelectMax, kernels::kDirectSelectMax + 1}) {
    for (const bool ties : {false, true}) {
      const auto grad = make_values(n, 5, ties);
      auto c = make_compressor("topk:k=137,ef=off");
      const auto payload = compress(*c, grad, "g", 0);
      const auto expected = reference_topk(grad, 137);
      EXPECT_EQ(section_ints(payload, 0), expected) << "n=" << n << " ties=" << ties;
      const auto sent = decode(*c, payload, n);
      for (const std::int32_t i : expected) EXPECT_EQ(sent[i], grad[i]);
      EXPECT_EQ(c->last_stats().selected, 137u);
    }
  }
}

TEST(TopK, AllEqualMagnitudesPickTheFirstIndices) {
  std::vector<float> grad(1000, 0.25f);
  for (std::size_t i = 0; i < grad.size(); i += 2) grad[i] = -0.25f;
  auto c = make_compressor("topk:k=10,ef=off");
  const auto ids = section_ints(compress(*c, grad, "g", 0), 0);
  std::vector<std::int32_t> first(10);
  std::iota(first.begin(), first.end(), 0);
  EXPECT_EQ(ids, first);
}

TEST(TopK, MultiChunkTensorMatchesReferenceAndThreadCount) {
  // 2.5M elements: three histogram chunks of 1M and ties across chunk boundaries.
  const std::size_t n = 2'500'000;
  const auto grad = make_values(n, 9, /*ties=*/true);
  auto c = make_compressor("topk:ratio=0.01,ef=off");
  c->set_threads(3);
  const auto payload = compress(*c, grad, "big", 0);
  EXPECT_EQ(section_ints(payload, 0), reference_topk(grad, 25000));
  expect_thread_independent("topk:ratio=0.003", n, 2);
}

// The sampled bound (compressors/codecs/topk_select.h) only speeds the selection up: a layout that fools the sample (every
// sampled position holds a large value, the true top-k lies mostly elsewhere) must still give the exact top-k through
// the fallback, and ties at the bound (all-equal or all-zero tensors) the lowest indices.
TEST(TopK, SampledBoundFallbackAndTiesStayExact) {
  const std::size_t n = (std::size_t{1} << 20) + 12345;
  auto grad = make_values(n, 21);
  for (float& x : grad) x *= 0.3f;  // |x| <= 0.45
  const std::size_t samples = kernels::sample_count(n);
  for (std::size_t s = 0; s < samples; ++s) {
    grad[kernels::sample_position(s, n)] = (s % 2 ? -1.0f : 1.0f) * (1.0f + static_cast<float>(s) * 1e-5f);
  }
  const std::size_t k = kernels::k_of_ratio(0.01, n);
  ASSERT_GT(k, samples);  // fewer than k elements reach any sampled key
  for (int threads : {1, 3}) {
    auto c = make_compressor("topk:ratio=0.01");
    c->set_threads(threads);
    const auto payload = compress(*c, grad, "fooled", 0);
    EXPECT_EQ(section_ints(payload, 0), reference_topk(grad, k)) << threads;
  }
  for (const float level : {0.0f, 0.25f}) {
    std::vector<float> same(300'000, level);
    for (std::size_t i = 0; i < same.size(); i += 3) same[i] = -level;
    auto c = make_compressor("topk:ratio=0.01");
    const auto ids = section_ints(compress(*c, same, "same", 0), 0);
    std::vector<std::int32_t> first(3000);
    std::iota(first.begin(), first.end(), 0);
    EXPECT_EQ(ids, first) << level;
  }
}

TEST(TopK, RatioKAndClamping) {
  EXPECT_THROW(make_compressor("topk:ratio=0.1,k=3"), InvalidArgument);
  EXPECT_THROW(make_compressor("topk:ratio=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("topk:k=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("topk:values=f64"), InvalidArgument);
  const auto grad = make_values(1000, 3);
  auto by_ratio = make_compressor("topk:ratio=0.0123");
  EXPECT_EQ(section_ints(compress(*by_ratio, grad, "r", 0), 0).size(), 12u);  // round(12.3)
  auto tiny_ratio = make_compressor("topk:ratio=0.00001");
  EXPECT_EQ(section_ints(compress(*tiny_ratio, grad, "r", 0), 0).size(), 1u);  // max(1, round(0.01))
  auto huge_k = make_compressor("topk:k=5000");  // k >= numel: everything is sent
  const auto payload = compress(*huge_k, grad, "r", 0);
  EXPECT_EQ(section_ints(payload, 0).size(), 1000u);
  EXPECT_EQ(decode(*huge_k, payload, 1000), grad);
  EXPECT_EQ(residual(*huge_k, "r"), std::vector<float>(1000, 0.0f));
  // The canonical spec re-parses to the same compressor (ratio and k never both appear).
  EXPECT_EQ(make_compressor(huge_k->spec())->spec(), huge_k->spec());
  EXPECT_EQ(make_compressor("topk")->spec(), "topk:ef=on,nonfinite=raise,ratio=0.01,values=f32");
}

TEST(TopK, ErrorFeedbackIsExact) {
  expect_exact_error_feedback("topk:ratio=0.05", 4099, 6);
  expect_exact_error_feedback("topk:k=1", 17, 20);
}

TEST(TopK, HalfValuesKeepErrorFeedbackExactAndSaturate) {
  const std::size_t n = 2000;
  auto c = make_compressor("topk:ratio=0.05,values=f16");
  std::vector<float> grad = make_values(n, 4);
  grad[10] = 1e6f;  // beyond half range: saturates to 65504, the rest stays in the residual
  const auto payload = compress(*c, grad, "h", 0);
  EXPECT_EQ(c->last_stats().saturated, 1u);
  const auto sent = decode(*c, payload, n);
  EXPECT_EQ(sent[10], 65504.0f);
  const auto after = residual(*c, "h");
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(after[i] + sent[i], grad[i]) << i;  // exact: v - half(v) is representable
    if (sent[i] != 0.0f && i != 10) {
      EXPECT_EQ(sent[i], kernels::half_bits_to_float(kernels::float_to_half_bits(grad[i])));
    }
  }
  EXPECT_LT(payload.size(), make_compressor("topk:ratio=0.05")->max_payload_bytes(n));
}

TEST(TopK, AccumulateAddsEveryRanksPayload) {
  const std::size_t n = 500;
  auto a = make_compressor("topk:k=20");
  auto b = make_compressor("topk:k=20");
  const auto ga = make_values(n, 11), gb = make_values(n, 12);
  const auto pa = compress(*a, ga, "x", 0), pb = compress(*b, gb, "x", 0);
  std::vector<float> sum(n, 1.0f);
  const auto view = TensorView::of(std::span<float>(sum));
  a->decompress(pa, view, DecodeMode::kAccumulate);
  a->decompress(pb, view, DecodeMode::kAccumulate);
  const auto da = decode(*a, pa, n), db = decode(*a, pb, n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(sum[i], 1.0f + da[i] + db[i]);
}

TEST(TopK, StateSaveLoadIsBitIdentical) {
  expect_state_round_trip("topk:ratio=0.02", 3000);
  expect_state_round_trip("topk:k=7,values=f16", 3000);
}

TEST(TopK, CorruptPayloadsAreRejected) {
  EXPECT_GT(expect_corruptions_rejected("topk:k=9", 300), 100u);
  // Hand-made hostile payloads: duplicate, decreasing, out-of-range indices; k larger than numel.
  auto c = make_compressor("topk:k=3");
  const auto valid = compress(*c, make_values(100, 1), "c", 0);
  const payload::Header header = payload::peek_header(valid);
  auto with_index = [&](std::size_t j, std::int32_t value) {
    auto bytes = valid;
    std::memcpy(bytes.data() + payload::section_offset(header, 0) + 4 * j, &value, 4);
    return bytes;
  };
  const auto ids = section_ints(valid, 0);
  std::vector<float> out(100, 3.0f);
  const auto view = TensorView::of(std::span<float>(out));
  EXPECT_THROW(c->decompress(with_index(1, ids[0]), view, DecodeMode::kOverwrite), CorruptPayload);  // duplicate
  EXPECT_THROW(c->decompress(with_index(2, 100), view, DecodeMode::kOverwrite), CorruptPayload);     // == numel
  EXPECT_THROW(c->decompress(with_index(0, -1), view, DecodeMode::kOverwrite), CorruptPayload);      // negative
  EXPECT_THROW(c->decompress(with_index(0, ids[2] + 1), view, DecodeMode::kOverwrite), CorruptPayload);  // decreasing
  EXPECT_EQ(out, std::vector<float>(100, 3.0f));
  std::vector<float> small(2);
  EXPECT_THROW(c->decompress(valid, TensorView::of(std::span<float>(small)), DecodeMode::kOverwrite), CorruptPayload);
  // A payload of another codec is refused.
  auto other = make_compressor("randomk");
  EXPECT_THROW(other->decompress(valid, view, DecodeMode::kOverwrite), CorruptPayload);
}

TEST(TopK, TinyTensors) {
  expect_tiny_tensors_work("topk");
  expect_tiny_tensors_work("topk:k=2,values=f16");
  auto c = make_compressor("topk");
  EXPECT_EQ(c->max_payload_bytes(0), payload::kHeaderBytes);
  const auto payload = compress(*c, {}, "empty", 0);
  EXPECT_EQ(section_ints(payload, 0).size(), 0u);
}

TEST(TopK, NonFiniteValuesFollowThePolicy) {
  std::vector<float> grad = make_values(100, 8);
  grad[5] = std::nanf("");
  auto raise = make_compressor("topk:k=3");
  EXPECT_THROW(compress(*raise, grad, "n", 0), InvalidArgument);
  auto pass = make_compressor("topk:k=3,nonfinite=pass");
  const auto payload = compress(*pass, grad, "n", 0);
  EXPECT_EQ(section_ints(payload, 0)[0], 5);  // NaN ranks above every finite magnitude
  for (const float r : residual(*pass, "n")) EXPECT_TRUE(std::isfinite(r));
  auto skip = make_compressor("topk:k=3,nonfinite=skip");
  const auto skipped = decode(*skip, compress(*skip, grad, "n", 0), 100);
  EXPECT_EQ(skipped, std::vector<float>(100, 0.0f));
}

}  // namespace
}  // namespace gradcomp::testing
