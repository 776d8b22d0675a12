#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "compressors/codecs/dgc.h"
#include "sparse_test_util.h"

namespace gradcomp::testing {
namespace {

TEST(Dgc, WarmupFollowsTheSchedule) {
  const std::size_t n = 100000;
  auto c = make_compressor("dgc:ratio=0.001,warmup_steps=2");
  // Densities 25%, 6.25%, 1.5625%, 0.390625% for two steps each, then the final 0.1%: k = max(1, round(d*n)).
  const std::vector<double> expected_k = {25000, 25000, 6250, 6250, 1563, 1563, 391, 391, 100, 100, 100};
  for (std::uint64_t step = 0; step < expected_k.size(); ++step) {
    const auto payload = compress(*c, make_values(n, 40 + step), "w", step);
    const auto& scalars = state(*c, "w").scalars;
    EXPECT_EQ(scalars[kDgcTargetK], expected_k[step]) << step;
    const double sent = static_cast<double>(section_ints(payload, 0).size());
    EXPECT_GE(sent, 0.7 * expected_k[step]) << step;
    EXPECT_LE(sent, 1.3 * expected_k[step]) << step;
    EXPECT_LE(payload.size(), c->max_payload_bytes(n));
  }
  // Without warm-up the first step already uses the final ratio.
  auto plain = make_compressor("dgc:ratio=0.001");
  compress(*plain, make_values(n, 1), "w", 0);
  EXPECT_EQ(state(*plain, "w").scalars[kDgcTargetK], 100.0);
}

TEST(Dgc, SampledThresholdKeepsTheCountWithin30PercentOfK) {
  const std::size_t n = 1'000'000;
  auto c = make_compressor("dgc:ratio=0.01,sample=0.01,momentum=0.9");
  int accepted = 0;
  for (std::uint64_t step = 0; step < 4; ++step) {
    const auto payload = compress(*c, make_values(n, 60 + step), "s", step);
    const auto& scalars = state(*c, "s").scalars;
    const double k = scalars[kDgcTargetK];
    ASSERT_EQ(k, 10000.0);
    const auto ids = section_ints(payload, 0);
    EXPECT_GE(ids.size(), 7000u) << step;
    EXPECT_LE(ids.size(), 13000u) << step;
    if (scalars[kDgcPath] == 0) {
      ++accepted;
      // Accepted threshold: everything sent is >= it, everything kept (the masked accumulator) is below it.
      const auto sent = decode(*c, payload, n);
      const float threshold = static_cast<float>(scalars[kDgcThreshold]);
      const auto& v = state(*c, "s").buffers[0];
      for (const std::int32_t i : ids) EXPECT_GE(std::fabs(sent[i]), threshold);
      for (std::size_t i = 0; i < n; ++i) {
        if (sent[i] == 0.0f) {
          ASSERT_LT(std::fabs(v[i]), threshold) << i;
        }
      }
    }
  }
  EXPECT_GE(accepted, 3) << "a 1% sample of a smooth distribution should estimate the threshold within 30%";
}

TEST(Dgc, RefinesWhenTheSampledThresholdSelectsTooMany) {
  // Half the values share the largest magnitude: any sampled threshold selects ~n/2 >> 1.3k, so the selection is
  // refined to exactly k, ties going to the lowest indices.
  const std::size_t n = 200000;
  std::vector<float> grad(n, 0.001f);
  for (std::size_t i = 0; i < n; i += 2) grad[i] = 1.0f;
  auto c = make_compressor("dgc:ratio=0.01,momentum=0");
  const auto ids = section_ints(compress(*c, grad, "r", 0), 0);
  EXPECT_EQ(state(*c, "r").scalars[kDgcPath], 1.0);
  ASSERT_EQ(ids.size(), 2000u);
  for (std::size_t j = 0; j < ids.size(); ++j) EXPECT_EQ(ids[j], static_cast<std::int32_t>(2 * j));
}

// Reference DGC on a small tensor (exact selection path): momentum correction, masking, clipping.
void expect_matches_reference(const std::string& options, float momentum, bool nesterov, float clip) {
  const std::size_t n = 1500, k = 15;  // 1500 < 2 x 1024 samples: exact top-k path
  auto c = make_compressor("dgc:ratio=0.01," + options);
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  for (std::uint64_t step = 0; step < 5; ++step) {
    const auto grad = make_values(n, 80 + step);
    float scale = 1.0f;
    if (clip > 0) {
      double sum = 0;
      for (const float g : grad) sum += double(g) * g;
      if (std::sqrt(sum) > clip) scale = static_cast<float>(clip / std::sqrt(sum));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float g = scale == 1.0f ? grad[i] : grad[i] * scale;
      if (nesterov) {
        u[i] = momentum * (u[i] + g);
        v[i] = v[i] + (u[i] + g);
      } else {
        u[i] = std::fma(momentum, u[i], g);
        v[i] = v[i] + u[i];
      }
    }
    std::vector<std::int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    order.resize(k);
    std::sort(order.begin(), order.end());
    const auto payload = compress(*c, grad, "ref", step);
    ASSERT_EQ(section_ints(payload, 0), order) << options << " step " << step;
    const auto sent = decode(*c, payload, n);
    for (const std::int32_t i : order) {
      ASSERT_EQ(sent[i], v[i]);
      v[i] = 0.0f;
      u[i] = 0.0f;
    }
    EXPECT_EQ(bits_of(state(*c, "ref").buffers[0]), bits_of(v)) << options << " accumulator, step " << step;
    EXPECT_EQ(bits_of(state(*c, "ref").buffers[1]), bits_of(u)) << options << " momentum, step " << step;
  }
}

TEST(Dgc, MomentumCorrectionMaskingAndClippingMatchTheReference) {
  expect_matches_reference("momentum=0.9", 0.9f, false, 0.0f);
  expect_matches_reference("momentum=0.8,nesterov=on", 0.8f, true, 0.0f);
  expect_matches_reference("momentum=0.9,clip=1.5", 0.9f, false, 1.5f);
}

TEST(Dgc, ErrorFeedbackIsExactWithoutMomentum) {
  // With momentum 0, u = g and the accumulator is plain error feedback: v_after + sent == v_before + g exactly.
  expect_exact_error_feedback("dgc:ratio=0.02,momentum=0", 5000, 6);
  expect_exact_error_feedback("dgc:ratio=0.01,momentum=0", 300000, 3);  // sampled-threshold path
}

TEST(Dgc, ThreadCountIndependence) { expect_thread_independent("dgc:ratio=0.005,warmup_steps=1", 400000, 4); }

TEST(Dgc, StateSaveLoadIsBitIdentical) {
  expect_state_round_trip("dgc:ratio=0.01,momentum=0.9", 4000);
  expect_state_round_trip("dgc:ratio=0.001,warmup_steps=1,nesterov=on", 100000);
}

TEST(Dgc, CorruptPayloadsAreRejected) { EXPECT_GT(expect_corruptions_rejected("dgc:ratio=0.05", 300), 50u); }

TEST(Dgc, TinyTensorsAndParameters) {
  expect_tiny_tensors_work("dgc");
  expect_tiny_tensors_work("dgc:warmup_steps=1,nesterov=on,clip=1");
  EXPECT_THROW(make_compressor("dgc:ef=off"), InvalidArgument);
  EXPECT_THROW(make_compressor("dgc:nesterov=on,momentum=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("dgc:momentum=1"), InvalidArgument);
  EXPECT_THROW(make_compressor("dgc:sample=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("dgc:clip=-1"), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp::testing
