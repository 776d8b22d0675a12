// SegmentVerdicts (compressors/framework/ef_flow.h), the error-feedback decisions every codec's flow runs (the
// segment stores' compress_segments() and PowerSGD's step): the non-finite policy per segment, then which segments
// commit, whether dirty, and whose step counts.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "compressors/framework/ef_flow.h"
#include "gradcomp/error.h"

namespace gradcomp {
namespace {

// Records what the verdicts commit.
class RecordingCommit final : public StateCommit {
 public:
  void commit(std::size_t s, bool dirty) override { commits.emplace_back(s, dirty); }
  void finish(bool any_skipped) override {
    ++finishes;
    skipped = any_skipped;
  }
  std::vector<std::pair<std::size_t, bool>> commits;
  int finishes = 0;
  bool skipped = false;
};

// Three segments: a whole tensor "a", the second chunk of "b" (its step counts where its first chunk is), "c".
std::vector<TensorSegment> three_segments() {
  return {TensorSegment{"a", 0, 4, 0, 4}, TensorSegment{"b", 4, 3, 5, 8}, TensorSegment{"c", 7, 2, 0, 2}};
}

CompressContext context() {
  CompressContext ctx;
  ctx.name = "fused";
  ctx.rank = 3;
  ctx.step = 7;
  return ctx;
}

TEST(SegmentVerdicts, CommitsEverySegmentAndCountsEachTensorsStepOnce) {
  const auto segments = three_segments();
  SegmentVerdicts verdicts("topk", NonFinitePolicy::kRaise, segments);
  std::uint64_t steps[3] = {0, 0, 0};
  std::uint64_t* step_of[3] = {&steps[0], &steps[1], &steps[2]};
  RecordingCommit store;
  EXPECT_FALSE(verdicts.commit(store, step_of));
  EXPECT_EQ(store.commits, (std::vector<std::pair<std::size_t, bool>>{{0, false}, {1, false}, {2, false}}));
  EXPECT_EQ(store.finishes, 1);
  EXPECT_EQ(steps[0], 1u);
  EXPECT_EQ(steps[1], 0u);  // a chunk that does not start its tensor
  EXPECT_EQ(steps[2], 1u);
}

TEST(SegmentVerdicts, RaiseNamesTheSegmentAndItsFirstValue) {
  const auto segments = three_segments();
  SegmentVerdicts verdicts("powersgd", NonFinitePolicy::kRaise, segments);
  verdicts.note(0, 0, context(), [] { return std::pair<std::size_t, float>{0, 0.0f}; });  // nothing found: no call
  try {
    const float inf = std::numeric_limits<float>::infinity();
    verdicts.note(1, 2, context(), [inf] { return std::pair<std::size_t, float>{1, inf}; });
    FAIL() << "raise did not throw";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("compressor 'powersgd': gradient 'b'"), std::string::npos) << message;
    EXPECT_NE(message.find("on rank 3"), std::string::npos) << message;
    EXPECT_NE(message.find("2 non-finite value(s), the first at index 6"), std::string::npos) << message;
  }
}

TEST(SegmentVerdicts, SkipZeroesAndKeepsTheStateAndPassCommitsDirty) {
  const auto segments = three_segments();
  const auto never = []() -> std::pair<std::size_t, float> { throw std::logic_error("located without raise"); };
  SegmentVerdicts skip("qsgd", NonFinitePolicy::kSkip, segments);
  skip.note(2, 1, context(), never);
  EXPECT_TRUE(skip.zero(2));
  EXPECT_FALSE(skip.dirty(2));
  std::uint64_t steps[3] = {0, 0, 0};
  std::uint64_t* step_of[3] = {&steps[0], nullptr, &steps[2]};  // null: a segment without state
  RecordingCommit store;
  EXPECT_TRUE(skip.commit(store, step_of));
  EXPECT_EQ(store.commits, (std::vector<std::pair<std::size_t, bool>>{{0, false}, {1, false}}));
  EXPECT_TRUE(store.skipped);
  EXPECT_EQ(steps[0], 1u);
  EXPECT_EQ(steps[2], 0u);  // skipped: its step is not counted

  SegmentVerdicts pass("qsgd", NonFinitePolicy::kPass, segments);
  pass.note(0, 3, context(), never);
  EXPECT_FALSE(pass.zero(0));
  EXPECT_TRUE(pass.dirty(0));
  RecordingCommit pass_store;
  EXPECT_FALSE(pass.commit(pass_store, step_of));
  EXPECT_EQ(pass_store.commits, (std::vector<std::pair<std::size_t, bool>>{{0, true}, {1, false}, {2, false}}));
}

}  // namespace
}  // namespace gradcomp
