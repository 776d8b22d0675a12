// The fused non-finite scan (ErrorFeedbackCompressor::fuses_nonfinite_scan; every dense codec, topk and randomk opt
// in): the codec counts NaN/Inf in its own encode pass and writes the new residual into a second buffer, so a raising
// or skipped step must leave the state exactly as it was and the next finite step must match an uninterrupted run; the
// count and first index must be exact, identical for any thread count, and about the gradient (not g + residual).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(n);
  for (auto& v : values) v = dist(rng);
  return values;
}

std::vector<std::byte> run(Compressor& codec, const std::vector<float>& grad, std::uint64_t step) {
  CompressContext ctx{.name = "layer.weight", .step = step};
  return compress_to_vector(codec, TensorView::of(std::span<const float>(grad)), ctx);
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

class FusedScan : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Codecs, FusedScan,
                         ::testing::Values("qsgd:bits=4", "qsgd:bits=8,scale=l2,bucket=64", "qsgd:bits=3,ef=off",
                                           "terngrad:bucket=512", "terngrad:bucket=0", "terngrad:clip=0,bucket=128",
                                           "onebit:bucket=512", "onebit:bucket=8,ef=off", "fp16", "fp16:prescale=0.5",
                                           "bf16", "bf16:ef=off", "none", "topk", "topk:ratio=0.05",
                                           "topk:ratio=0.05,ef=off", "topk:k=100,values=f16", "randomk",
                                           "randomk:ratio=0.1,ef=off"));

// `spec` with one more parameter.
std::string with(const std::string& spec, const std::string& param) {
  return fmt::format("{}{}{}", spec, spec.find(':') == std::string::npos ? ":" : ",", param);
}

TEST_P(FusedScan, RaiseLeavesStateUntouchedAndNextStepMatchesUninterruptedRun) {
  const std::size_t n = 150'000;  // three parallel chunks, so the residual buffers are large enough to stream
  for (int threads : {1, 3}) {
    auto codec = make_compressor(with(GetParam(), "nonfinite=raise"));
    auto reference = make_compressor(with(GetParam(), "nonfinite=raise"));
    codec->set_threads(threads);
    reference->set_threads(threads);
    for (std::uint64_t step = 0; step < 2; ++step) {
      ASSERT_EQ(run(*codec, normal(n, 10 + static_cast<std::uint32_t>(step)), step),
                run(*reference, normal(n, 10 + static_cast<std::uint32_t>(step)), step));
    }
    const auto before = codec->save_state();
    auto bad = normal(n, 12);
    bad[140'001] = kNaN;
    bad[70'003] = -kInf;  // the first one, in another chunk than the NaN
    bad[70'010] = kInf;
    try {
      run(*codec, bad, 2);
      ADD_FAILURE() << GetParam() << ": no exception for NaN under nonfinite=raise";
    } catch (const InvalidArgument& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("'layer.weight'"), std::string::npos) << what;
      EXPECT_NE(what.find("has 3 non-finite value(s), the first at index 70003 (-inf)"), std::string::npos) << what;
      EXPECT_NE(what.find("at step 2"), std::string::npos) << what;
    }
    EXPECT_EQ(codec->save_state(), before) << GetParam() << " threads " << threads;
    // A second raise in a row (the spare buffer now holds the discarded residual) changes nothing either.
    EXPECT_THROW(run(*codec, bad, 2), InvalidArgument);
    EXPECT_EQ(codec->save_state(), before) << GetParam() << " threads " << threads;
    for (std::uint64_t step = 2; step < 4; ++step) {
      const auto grad = normal(n, 20 + static_cast<std::uint32_t>(step));
      ASSERT_EQ(run(*codec, grad, step), run(*reference, grad, step)) << GetParam() << " step " << step;
    }
    EXPECT_EQ(codec->save_state(), reference->save_state()) << GetParam();
  }
}

TEST_P(FusedScan, SkipAndPassCountExactlyForAnyThreadCount) {
  const std::size_t n = 200'003;  // partial last bucket
  auto grad = normal(n, 5);
  const std::vector<std::size_t> bad_at = {3, 4, 511, 512, 65'536, 131'071, 200'002};
  for (std::size_t i : bad_at) grad[i] = (i % 2) ? kNaN : -kInf;
  std::vector<std::vector<std::byte>> pass_payloads, pass_states;
  for (int threads : {1, 2, 3}) {
    auto skip = make_compressor(with(GetParam(), "nonfinite=skip"));
    skip->set_threads(threads);
    run(*skip, normal(n, 6), 0);
    const auto before = skip->save_state();
    run(*skip, grad, 1);
    EXPECT_TRUE(skip->last_stats().skipped);
    EXPECT_EQ(skip->last_stats().nonfinite, bad_at.size()) << GetParam() << " threads " << threads;
    EXPECT_EQ(skip->save_state(), before) << GetParam();

    auto pass = make_compressor(with(GetParam(), "nonfinite=pass"));
    pass->set_threads(threads);
    run(*pass, normal(n, 6), 0);
    pass_payloads.push_back(run(*pass, grad, 1));
    EXPECT_FALSE(pass->last_stats().skipped);
    EXPECT_EQ(pass->last_stats().nonfinite, bad_at.size()) << GetParam() << " threads " << threads;
    pass_states.push_back(pass->save_state());
    const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(pass.get());
    ASSERT_NE(ef, nullptr);
    for (float v : ef->state_of("layer.weight")->buffers[0]) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(pass_payloads[0], pass_payloads[1]);
  EXPECT_EQ(pass_payloads[0], pass_payloads[2]);
  EXPECT_EQ(pass_states[0], pass_states[1]);
  EXPECT_EQ(pass_states[0], pass_states[2]);
}

// Only the gradient's own NaN/Inf count: a finite gradient whose sum with the residual overflows is not rejected
// (the codec still sends a NaN scale for that bucket and keeps its residual finite, as without the fused scan).
TEST(FusedScanOverflow, FiniteGradientWhoseSumWithResidualOverflowsIsNotRaised) {
  for (const char* spec : {"qsgd:bits=2,bucket=8,nonfinite=raise", "terngrad:clip=0,bucket=8,nonfinite=raise"}) {
    auto codec = make_compressor(spec);
    // Per bucket of 8: one 3.2e38 sets the scale; 2e38 rounds to 0 or 3.2e38, leaving a residual of 2e38 or -1.2e38.
    std::vector<float> grad(4096, 2e38f);
    for (std::size_t i = 0; i < grad.size(); i += 8) grad[i] = 3.2e38f;
    run(*codec, grad, 0);
    const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(codec.get());
    ASSERT_NE(ef, nullptr);
    const auto& residual = ef->state_of("layer.weight")->buffers[0];
    std::size_t positive = 0;
    for (float r : residual) positive += r > 1e38f;
    ASSERT_GT(positive, 0u) << spec << ": the setup needs some residual of +2e38";
    ASSERT_NO_THROW(run(*codec, grad, 1)) << spec;  // 2e38 + 2e38 overflows, the gradient does not
    EXPECT_EQ(codec->last_stats().nonfinite, 0u) << spec;
    for (float r : ef->state_of("layer.weight")->buffers[0]) ASSERT_TRUE(std::isfinite(r)) << spec;
  }
}

}  // namespace
}  // namespace gradcomp
