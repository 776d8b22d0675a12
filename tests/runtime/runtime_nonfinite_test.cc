// NaN/Inf in one rank's gradient at one step, inside a fusion buffer: the non-finite policy applies to that tensor
// only, its error-feedback state is kept by the codec under its own name, and nothing leaks into later steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;
using testing::run_ranks_collect;

constexpr int kRanks = 2, kSteps = 5, kBadStep = 2, kBadRank = 1;
const std::vector<std::size_t> kSizes = {1500, 700, 2600};  // "a", "b", "c": fused into one buffer
const char* const kNames[] = {"a", "b", "c"};
constexpr std::size_t kBad = 1;  // tensor "b"

enum class Dirt { kNone, kNaN, kZeros };

// results[step][tensor] on every rank (they agree), and each rank's residual of every tensor after every step.
struct Steps {
  std::vector<std::vector<std::vector<float>>> results;                 // [step][tensor]
  std::vector<std::vector<std::vector<std::vector<float>>>> residuals;  // [rank][step][tensor]
};

std::vector<float> gradient(int rank, int step, std::size_t tensor) {
  std::mt19937 rng(static_cast<unsigned>(1000 * rank + 10 * step + tensor));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(kSizes[tensor]);
  for (float& v : values) v = normal(rng);
  return values;
}

// kSteps steps of the three tensors through one runtime per rank; at kBadStep rank kBadRank's "b" is dirtied.
Steps train(const std::string& spec, Dirt dirt) {
  Steps run;
  run.results.assign(kSteps, std::vector<std::vector<float>>(kSizes.size()));
  run.residuals.assign(kRanks, {});
  std::mutex mutex;
  run_ranks(kRanks, [&](Communicator& comm) {
    RuntimeOptions options;
    options.timeline_path = "";
    // Long cycles without idle back-off (an enqueue then never wakes the thread early): the three tensors, submitted
    // microseconds apart, meet in one cycle and so in one buffer, the same grouping in every run compared.
    options.cycle_time_ms = 60;
    options.idle_cycle_max_ms = 0;
    options.fusion_threshold_bytes = std::size_t{1} << 20;
    Runtime rt(comm, options);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> data(kSizes.size());
      for (std::size_t t = 0; t < kSizes.size(); ++t) data[t] = gradient(comm.rank(), step, t);
      if (step == kBadStep && comm.rank() == kBadRank && dirt != Dirt::kNone) {
        auto& b = data[kBad];
        if (dirt == Dirt::kZeros) {
          std::fill(b.begin(), b.end(), 0.0f);
        } else {
          b[17] = std::nanf("");
          b[400] = INFINITY;
        }
      }
      for (std::size_t t = 0; t < kSizes.size(); ++t) {
        rt.allreduce_async(kNames[t], TensorView::of(std::span<float>(data[t])), spec);
      }
      rt.synchronize();
      std::vector<std::vector<float>> residuals;
      for (std::size_t t = 0; t < kSizes.size(); ++t) residuals.push_back(rt.residual(kNames[t]));
      std::lock_guard lock(mutex);
      run.residuals[comm.rank()].push_back(std::move(residuals));
      if (comm.rank() == 0) run.results[step] = data;
    }
    EXPECT_EQ(rt.stats().buffers.back().tensors, kSizes.size()) << "the three tensors should share one buffer";
  });
  return run;
}

std::string with_policy(const std::string& spec, const char* policy) {
  return spec + (spec.find(':') == std::string::npos ? ":" : ",") + "nonfinite=" + policy;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

// A gtest-safe name for a spec parameter ("topk:ratio=0.1" -> "topk_ratio_0_1").
std::string spec_test_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string name = info.param;
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class SkipWithoutErrorFeedback : public ::testing::TestWithParam<const char*> {};

// Without a residual, "send zeros for that tensor, leave its state untouched" is exactly a run whose gradient was
// zero there: every step, every tensor, bit for bit (the fused neighbours included: their top-k competes with b's).
TEST_P(SkipWithoutErrorFeedback, IsExactlyAZeroGradientForThatTensor) {
  const std::string spec = with_policy(GetParam(), "skip");
  const Steps skipped = train(spec, Dirt::kNaN);
  const Steps zeros = train(spec, Dirt::kZeros);
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      EXPECT_TRUE(same_bits(skipped.results[step][t], zeros.results[step][t]))
          << spec << ": tensor " << kNames[t] << " at step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, SkipWithoutErrorFeedback,
                         ::testing::Values("none", "topk:ratio=0.1,ef=off", "qsgd:bits=4,ef=off",
                                           "randomk:ratio=0.2,ef=off", "fp16:ef=off"),
                         spec_test_name);

class SkipWithErrorFeedback : public ::testing::TestWithParam<const char*> {};

// With error feedback: the skipped tensor's residual after the NaN step is its residual before it, bit for bit; the
// other tensors' residuals moved on; before the NaN every step equals a clean run; afterwards everything is finite.
TEST_P(SkipWithErrorFeedback, KeepsThatTensorsStateAndNothingElse) {
  const std::string spec = with_policy(GetParam(), "skip");
  const Steps skipped = train(spec, Dirt::kNaN);
  const Steps clean = train(spec, Dirt::kNone);
  for (int step = 0; step < kBadStep; ++step) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      EXPECT_TRUE(same_bits(skipped.results[step][t], clean.results[step][t])) << kNames[t] << " step " << step;
    }
  }
  const auto& bad_rank = skipped.residuals[kBadRank];
  ASSERT_EQ(bad_rank[kBadStep][kBad].size(), kSizes[kBad]) << spec << ": no residual kept for 'b'";
  EXPECT_TRUE(same_bits(bad_rank[kBadStep][kBad], bad_rank[kBadStep - 1][kBad]))
      << spec << ": the skipped step changed the residual of 'b' on rank " << kBadRank;
  for (std::size_t t : {std::size_t{0}, std::size_t{2}}) {
    EXPECT_FALSE(same_bits(bad_rank[kBadStep][t], bad_rank[kBadStep - 1][t]))
        << spec << ": tensor " << kNames[t] << " took no step on rank " << kBadRank;
  }
  EXPECT_FALSE(same_bits(skipped.residuals[0][kBadStep][kBad], skipped.residuals[0][kBadStep - 1][kBad]))
      << spec << ": the clean rank's 'b' took no step";
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      EXPECT_TRUE(all_finite(skipped.results[step][t])) << spec << ": " << kNames[t] << " step " << step;
      for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(all_finite(skipped.residuals[r][step][t]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, SkipWithErrorFeedback,
                         ::testing::Values("topk:ratio=0.05", "qsgd:bits=4", "onebit", "dgc:ratio=0.01",
                                           "fp16:prescale=1"),
                         spec_test_name);

class Pass : public ::testing::TestWithParam<const char*> {};

// nonfinite=pass transmits the NaN/Inf at that step, but never keeps one in a residual: later steps are finite.
TEST_P(Pass, LaterStepsStayFinite) {
  const std::string spec = with_policy(GetParam(), "pass");
  const Steps run = train(spec, Dirt::kNaN);
  for (int step = kBadStep + 1; step < kSteps; ++step) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      EXPECT_TRUE(all_finite(run.results[step][t])) << spec << ": " << kNames[t] << " at step " << step;
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    for (std::size_t t = 0; t < kSizes.size(); ++t) EXPECT_TRUE(all_finite(run.residuals[r][kBadStep][t]));
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Pass, ::testing::Values("topk:ratio=0.05", "qsgd:bits=4", "dgc:ratio=0.01"),
                         spec_test_name);

// nonfinite=raise names the user's tensor and the rank, not the fusion buffer it travels in.
TEST(Raise, NamesTheTensorAndRankInsideAFusedBuffer) {
  const auto errors = run_ranks_collect(
      kRanks,
      [&](Communicator& comm) {
        RuntimeOptions options;
        options.timeline_path = "";
        options.cycle_time_ms = 1;
        Runtime rt(comm, options);
        std::vector<std::vector<float>> data(kSizes.size());
        for (std::size_t t = 0; t < kSizes.size(); ++t) data[t] = gradient(comm.rank(), 0, t);
        if (comm.rank() == kBadRank) data[kBad][33] = std::nanf("");
        for (std::size_t t = 0; t < kSizes.size(); ++t) {
          rt.allreduce_async(kNames[t], TensorView::of(std::span<float>(data[t])), "topk:ratio=0.05");
        }
        rt.synchronize();
      },
      std::chrono::seconds(3));
  ASSERT_TRUE(errors[kBadRank]) << "rank " << kBadRank << " should have raised";
  try {
    std::rethrow_exception(errors[kBadRank]);
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("gradient 'b'"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
    EXPECT_NE(message.find("index 33"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace gradcomp
