// Runtime pieces that do not communicate: policy globs, fusion planning, the arena, the timeline writer, and the
// negotiator driven by hand for several simulated ranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "src/runtime/fusion.h"
#include "src/runtime/negotiator.h"
#include "src/runtime/policy.h"
#include "src/runtime/timeline.h"
#include "tests/runtime/json_check.h"

namespace gradcomp::runtime {
namespace {

TEST(Policy, GlobMatch) {
  EXPECT_TRUE(glob_match("*.bias", "layer1.conv.bias"));
  EXPECT_FALSE(glob_match("*.bias", "layer1.conv.weight"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("layer?.w", "layer3.w"));
  EXPECT_FALSE(glob_match("layer?.w", "layer10.w"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYbc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYYbd"));
  EXPECT_TRUE(glob_match("exact", "exact"));
  EXPECT_FALSE(glob_match("exact", "exactly"));
  EXPECT_TRUE(glob_match("**x", "x"));
}

TEST(Policy, ResolveFirstMatchMinimumAndDefault) {
  CompressionPolicy policy;
  policy.rules = {{"*.bias", "none"}, {"fc.*", "fp16"}, {"*", "topk:ratio=0.01"}};
  policy.default_spec = "qsgd";
  policy.min_compress_bytes = 1024;
  EXPECT_EQ(resolve_spec(policy, "conv.bias", 1 << 20), "none");
  EXPECT_EQ(resolve_spec(policy, "fc.weight", 1 << 20), "fp16");
  EXPECT_EQ(resolve_spec(policy, "conv.weight", 1 << 20), "topk:ratio=0.01");
  EXPECT_EQ(resolve_spec(policy, "conv.weight", 1000), "none");  // under the minimum: dense
  policy.rules.pop_back();
  EXPECT_EQ(resolve_spec(policy, "conv.weight", 4096), "qsgd");
}

TEST(Policy, CanonicalSpec) {
  EXPECT_EQ(canonical_spec("auto"), "auto");
  EXPECT_THROW(canonical_spec("no_such_codec"), InvalidArgument);
}

ReadyTensor tensor(const std::string& name, std::size_t numel, const std::string& spec = "none",
                   DType dtype = DType::kF32) {
  return ReadyTensor{name, Signature{numel, dtype, Device::cpu(), spec}};
}

TEST(Fusion, PacksUpToThresholdPerKind) {
  std::vector<ReadyTensor> ready = {tensor("a", 100), tensor("b", 100, "topk"), tensor("c", 100),
                                    tensor("d", 100), tensor("e", 1000), tensor("f", 100, "none", DType::kF16)};
  auto all = [](std::size_t) { return true; };
  // 1000 bytes: a (400) + c (400) fit, d would make 1200 -> new group.
  auto groups = plan_fusion(ready, 1000, all);
  ASSERT_EQ(groups.size(), 5u);
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(groups[0].offsets, (std::vector<std::size_t>{0, 100}));
  EXPECT_EQ(groups[0].bytes, 800u);
  EXPECT_EQ(groups[1].members, (std::vector<std::size_t>{1}));
  EXPECT_EQ(groups[2].members, (std::vector<std::size_t>{3}));
  EXPECT_EQ(groups[3].members, (std::vector<std::size_t>{4}));  // larger than the threshold: alone
  EXPECT_EQ(groups[4].members, (std::vector<std::size_t>{5}));
  // A large threshold puts every f32/none tensor together.
  groups = plan_fusion(ready, 1 << 20, all);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{0, 2, 3, 4}));
  EXPECT_EQ(groups[0].numel, 1300u);
  // Threshold 0: no fusion at all.
  EXPECT_EQ(plan_fusion(ready, 0, all).size(), ready.size());
  // Non-fusible tensors travel alone.
  groups = plan_fusion(ready, 1 << 20, [](std::size_t i) { return i != 2; });
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{0, 3, 4}));
}

TEST(Fusion, NeverMixesReduceOps) {
  std::vector<ReadyTensor> ready;
  for (int i = 0; i < 6; ++i) {
    ready.push_back(tensor(fmt::format("t{}", i), 100));
    ready.back().signature.op = i % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAverage;
  }
  const auto groups = plan_fusion(ready, 1 << 20, [](std::size_t) { return true; });
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].members, (std::vector<std::size_t>{0, 2, 4}));
  EXPECT_EQ(groups[0].op, ReduceOp::kSum);
  EXPECT_EQ(groups[1].members, (std::vector<std::size_t>{1, 3, 5}));
  EXPECT_EQ(groups[1].op, ReduceOp::kAverage);
}

TEST(Timeline, WritesValidChromeTrace) {
  const std::string path = ::testing::TempDir() + "/gradcomp_timeline_unit.json";
  {
    Timeline timeline;
    timeline.open(path, 3);
    const auto t0 = Clock::now();
    timeline.event("negotiate", "negotiate", 0, t0, t0 + std::chrono::microseconds(5));
    timeline.event("we\"ird\nname", "queue", 2, t0, t0 + std::chrono::microseconds(7), "{\"bytes\":10}");
    timeline.close();
    timeline.event("dropped", "x", 0, t0, t0);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  testing::Json json = testing::JsonParser(text.str()).parse();
  const auto& events = json.at("traceEvents").array;
  ASSERT_EQ(events.size(), 3u);  // metadata + 2
  EXPECT_EQ(events[1].at("name").string, "negotiate");
  EXPECT_EQ(events[1].at("ph").string, "X");
  EXPECT_EQ(events[1].at("pid").number, 3);
  EXPECT_NEAR(events[1].at("dur").number, 5.0, 0.01);
  EXPECT_EQ(events[2].at("name").string, "we\"ird\nname");
  EXPECT_EQ(events[2].at("args").at("bytes").number, 10);
  std::remove(path.c_str());
}

// Drives `ranks` negotiators through one cycle exactly as the runtime does over a communicator.
std::vector<CycleDecision> run_cycle(std::vector<Negotiator>& ranks, std::vector<bool> shutdown = {},
                                     std::uint64_t expire_before = 0) {
  const int n = static_cast<int>(ranks.size());
  std::vector<std::byte> all;
  for (int r = 0; r < n; ++r) {
    auto message = ranks[r].make_message(!shutdown.empty() && shutdown[r], expire_before);
    all.insert(all.end(), message.begin(), message.end());
  }
  std::vector<CycleSummary> summaries;
  for (int r = 0; r < n; ++r) summaries.push_back(ranks[r].summarize(all));
  std::vector<std::vector<std::byte>> blobs;
  if (summaries[0].any_announcements) {
    for (int r = 0; r < n; ++r) blobs.push_back(ranks[r].take_announcements());
  }
  std::vector<CycleDecision> decisions;
  for (int r = 0; r < n; ++r) decisions.push_back(ranks[r].decide(summaries[r], blobs));
  return decisions;
}

std::vector<std::string> names(const CycleDecision& decision) {
  std::vector<std::string> out;
  for (const auto& ready : decision.ready) out.push_back(ready.name);
  return out;
}

std::vector<Negotiator> make_ranks(int n) {
  std::vector<Negotiator> ranks;
  for (int r = 0; r < n; ++r) ranks.emplace_back(r, n, 16);
  return ranks;
}

TEST(Negotiator, ReadyOnlyWhenEveryRankSubmittedThenCached) {
  auto ranks = make_ranks(3);
  const Signature sig{10, DType::kF32, Device::cpu(), "none"};
  ranks[0].add_pending("b", sig);
  ranks[0].add_pending("a", sig);
  ranks[1].add_pending("a", sig);
  auto d = run_cycle(ranks);
  for (auto& decision : d) EXPECT_TRUE(decision.ready.empty());
  ranks[2].add_pending("a", sig);
  ranks[1].add_pending("b", sig);
  ranks[2].add_pending("b", sig);
  d = run_cycle(ranks);
  for (auto& decision : d) EXPECT_EQ(names(decision), (std::vector<std::string>{"a", "b"}));  // first announced first
  for (auto& rank : ranks) {
    rank.remove_pending("a");
    rank.remove_pending("b");
    EXPECT_EQ(rank.cached(), 2u);
  }
  // Steady state: cached names need only the bit vector (no announcements), in slot order whatever the local order.
  ranks[0].add_pending("b", sig);
  ranks[1].add_pending("a", sig);
  ranks[1].add_pending("b", sig);
  ranks[2].add_pending("b", sig);
  std::vector<std::byte> all;
  for (auto& rank : ranks) {
    auto message = rank.make_message(false, 0);
    all.insert(all.end(), message.begin(), message.end());
  }
  EXPECT_FALSE(ranks[0].summarize(all).any_announcements);
  d = run_cycle(ranks);
  for (auto& decision : d) EXPECT_EQ(names(decision), (std::vector<std::string>{"b"}));
}

// One cycle like run_cycle(), returning every rank's quiet() verdict (the runtime's idle back-off).
std::vector<bool> quiet_after_cycle(std::vector<Negotiator>& ranks) {
  std::vector<std::byte> all;
  for (auto& rank : ranks) {
    auto message = rank.make_message(false, 0);
    all.insert(all.end(), message.begin(), message.end());
  }
  std::vector<CycleSummary> summaries;
  for (auto& rank : ranks) summaries.push_back(rank.summarize(all));
  std::vector<std::vector<std::byte>> blobs;
  if (summaries[0].any_announcements) {
    for (auto& rank : ranks) blobs.push_back(rank.take_announcements());
  }
  std::vector<bool> quiet;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].decide(summaries[r], blobs);
    quiet.push_back(ranks[r].quiet(summaries[r]));
  }
  return quiet;
}

TEST(Negotiator, QuietOnlyWhenNoRankHasAnythingPendingAndAllAgree) {
  auto ranks = make_ranks(3);
  const Signature sig{10, DType::kF32, Device::cpu(), "none"};
  EXPECT_EQ(quiet_after_cycle(ranks), (std::vector<bool>{true, true, true}));
  // One rank announces a new name: not quiet on any rank, nor while the others have not announced it yet.
  ranks[1].add_pending("a", sig);
  EXPECT_EQ(quiet_after_cycle(ranks), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(quiet_after_cycle(ranks), (std::vector<bool>{false, false, false}));
  ranks[0].add_pending("a", sig);
  ranks[2].add_pending("a", sig);
  quiet_after_cycle(ranks);  // ready everywhere, now cached
  for (auto& rank : ranks) rank.remove_pending("a");
  EXPECT_EQ(quiet_after_cycle(ranks), (std::vector<bool>{true, true, true}));
  // A cached name pending on one rank only sets its bit: not quiet anywhere.
  ranks[2].add_pending("a", sig);
  EXPECT_EQ(quiet_after_cycle(ranks), (std::vector<bool>{false, false, false}));
}

TEST(Negotiator, MismatchFailsOnEveryRankNamingBothSides) {
  auto ranks = make_ranks(2);
  ranks[0].add_pending("w", Signature{10, DType::kF32, Device::cpu(), "none"});
  ranks[1].add_pending("w", Signature{20, DType::kF32, Device::cpu(), "none"});
  auto d = run_cycle(ranks);
  for (auto& decision : d) {
    EXPECT_TRUE(decision.ready.empty());
    ASSERT_EQ(decision.failed.size(), 1u);
    EXPECT_FALSE(decision.failed[0].timeout);
    EXPECT_NE(decision.failed[0].message.find("f32[10]"), std::string::npos);
    EXPECT_NE(decision.failed[0].message.find("f32[20]"), std::string::npos);
  }
}

TEST(Negotiator, TheOpIsPartOfTheSignature) {
  auto ranks = make_ranks(2);
  Signature sum{10, DType::kF32, Device::cpu(), "none", ReduceOp::kSum};
  ranks[0].add_pending("w", sum);
  ranks[1].add_pending("w", Signature{10, DType::kF32, Device::cpu(), "none"});
  for (auto& decision : run_cycle(ranks)) {
    ASSERT_EQ(decision.failed.size(), 1u);
    EXPECT_NE(decision.failed[0].message.find("op sum"), std::string::npos) << decision.failed[0].message;
    EXPECT_NE(decision.failed[0].message.find("op average"), std::string::npos) << decision.failed[0].message;
  }
  // Announced with one op everywhere, the op comes through in the decision.
  for (auto& rank : ranks) rank.add_pending("w", sum);
  for (auto& decision : run_cycle(ranks)) {
    ASSERT_EQ(decision.ready.size(), 1u);
    EXPECT_EQ(decision.ready[0].signature.op, ReduceOp::kSum);
  }
}

TEST(Negotiator, MismatchOfACachedNameEvictsAndFails) {
  auto ranks = make_ranks(2);
  const Signature small{10, DType::kF32, Device::cpu(), "none"};
  for (auto& rank : ranks) rank.add_pending("w", small);
  auto d = run_cycle(ranks);
  ASSERT_EQ(d[0].ready.size(), 1u);
  for (auto& rank : ranks) rank.remove_pending("w");
  ranks[0].add_pending("w", small);
  ranks[1].add_pending("w", Signature{99, DType::kF32, Device::cpu(), "none"});
  d = run_cycle(ranks);  // rank 1 announces; the slot is evicted everywhere
  for (auto& decision : d) EXPECT_TRUE(decision.ready.empty() && decision.failed.empty());
  d = run_cycle(ranks);  // rank 0 re-announces: both sides known
  for (auto& decision : d) {
    ASSERT_EQ(decision.failed.size(), 1u);
    EXPECT_NE(decision.failed[0].message.find("f32[99]"), std::string::npos);
  }
}

TEST(Negotiator, ExpiryAndShutdown) {
  auto ranks = make_ranks(2);
  const Signature sig{10, DType::kF32, Device::cpu(), "none"};
  ranks[0].add_pending("lonely", sig);
  auto d = run_cycle(ranks);
  EXPECT_TRUE(d[0].failed.empty());
  d = run_cycle(ranks, {}, /*expire_before=*/1);  // rank 0's clock says cycle 0 is too old
  for (auto& decision : d) {
    ASSERT_EQ(decision.failed.size(), 1u);
    EXPECT_TRUE(decision.failed[0].timeout);
    EXPECT_NE(decision.failed[0].message.find("rank(s) 1"), std::string::npos);
  }
  d = run_cycle(ranks, {true, false});
  EXPECT_FALSE(d[0].shutdown);
  d = run_cycle(ranks, {true, true});
  EXPECT_TRUE(d[0].shutdown && d[1].shutdown);
}

// More cached names than one word of packed bits: the ready ones run in slot order across word boundaries, a name
// some ranks marked waits (and joins once all did), and a cached name still partial at the deadline fails naming the
// ranks that lack it.
TEST(Negotiator, ManyCachedNamesAcrossWords) {
  std::vector<Negotiator> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(r, 3, 300);
  const Signature sig{10, DType::kF32, Device::cpu(), "none"};
  std::vector<std::string> all;
  for (int i = 0; i < 150; ++i) all.push_back(fmt::format("n{:03}", i));
  for (auto& rank : ranks) {
    for (const auto& name : all) rank.add_pending(name, sig);
  }
  auto d = run_cycle(ranks);
  ASSERT_EQ(d[0].ready.size(), 150u);  // announced together: by name, and cached in that order
  for (auto& rank : ranks) {
    for (const auto& name : all) rank.remove_pending(name);
  }
  // Cached: ranks 0 and 1 mark every name, rank 2 the even ones (and n149).
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 150; ++i) {
      if (r < 2 || i % 2 == 0 || i == 149) ranks[r].add_pending(all[i], sig);
    }
  }
  d = run_cycle(ranks);
  std::vector<std::string> evens;
  for (int i = 0; i < 150; i += 2) evens.push_back(all[i]);
  evens.push_back(all[149]);
  for (auto& decision : d) EXPECT_EQ(names(decision), evens);
  for (int r = 0; r < 3; ++r) {
    for (const auto& name : evens) ranks[r].remove_pending(name);
  }
  // Rank 2 now marks the odd ones below 100: they run; 101..147 stay partial, then pass the deadline.
  for (int i = 1; i < 100; i += 2) ranks[2].add_pending(all[i], sig);
  d = run_cycle(ranks);
  ASSERT_EQ(d[1].ready.size(), 50u);
  EXPECT_EQ(d[1].ready.front().name, "n001");
  EXPECT_EQ(d[1].ready.back().name, "n099");
  EXPECT_TRUE(d[1].failed.empty());
  for (int r = 0; r < 3; ++r) {
    for (int i = 1; i < 100; i += 2) ranks[r].remove_pending(all[i]);
  }
  d = run_cycle(ranks, {}, /*expire_before=*/1);  // the partial slots became partial in cycle 1 (not before 1)
  EXPECT_TRUE(d[0].failed.empty());
  d = run_cycle(ranks, {}, /*expire_before=*/2);
  for (auto& decision : d) {
    ASSERT_EQ(decision.failed.size(), 24u);  // n101, n103, ..., n147
    EXPECT_EQ(decision.failed.front().name, "n101");
    EXPECT_NE(decision.failed.front().message.find("rank(s) 2"), std::string::npos);
    EXPECT_TRUE(decision.ready.empty());
  }
}

}  // namespace
}  // namespace gradcomp::runtime
