// The hierarchical `auto` mode: the cost model's choice on known collective costs (a large cluster, and the costs
// measured on 2 emulated hosts x 2 ranks here), and on 4 in-process ranks in 2 emulated nodes the learned model, one
// decision on every rank, and results equal to the mode it chose.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/comm/allreduce_check.h"
#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

constexpr bool kReduced = false;  // dense, sra, rounds: the payloads are summed
constexpr bool kGathered = true;  // allgather, sparse: the payloads are gathered

// Costs fitted to 2 emulated hosts x 2 ranks at 1 Gbit/s on this VM (bench/net/hierarchy_table.sh, 16 MiB): a world
// allreduce 201 ms, a node allreduce 44 ms, an allreduce between the 2 leaders 262 ms (MPI moves more bytes per rank
// for 2 ranks than its 4-rank ring does), allgathers of 1 Gbit/s shared by the ranks of a host.
LinkModel measured_two_by_two() {
  const double s = 16.0 * (1 << 20);
  LinkModel m;
  m.node_allreduce = {2e-4, s / 0.044};
  m.leader_allreduce = {2e-5, s / 0.262};
  m.leader_allgather = {2e-5, 125e6};
  m.world_allreduce = {2e-4, s / 0.201};
  m.world_allgather = {2e-4, 125e6 / 3};
  m.measured = true;
  return m;
}

// 8 nodes x 8 ranks, fast inside (50 GB/s), 10 Gbit/s between: an allgather over the world receives 63 payloads
// through each host's link, one between leaders 7.
LinkModel large_cluster() {
  LinkModel m;
  m.node_allreduce = {1e-5, 50e9};
  m.leader_allreduce = {1e-4, 1.25e9 / 2};
  m.leader_allgather = {1e-4, 1.25e9 / 7};
  m.world_allreduce = {1e-3, 1.25e9 / 2};
  m.world_allgather = {1e-3, 1.25e9 / 63};
  m.measured = true;
  return m;
}

TEST(HierarchyModel, SparsePayloadsOnALargeClusterGoHierarchical) {
  const std::size_t numel = std::size_t{16} << 20;
  const std::size_t payload = numel / 100 * 8;  // top-k 1%: (index, value) pairs
  const auto choice = choose_hierarchy(large_cluster(), {64, 8, 8}, kGathered, numel, payload);
  EXPECT_TRUE(choice.hierarchical) << choice.flat_s << " vs " << choice.hierarchical_s;
  EXPECT_NEAR(choice.flat_s, 1e-3 + payload * 63 / 1.25e9, 1e-9);
}

TEST(HierarchyModel, TheMeasuredTwoByTwoStaysFlat) {
  const std::size_t numel = std::size_t{4} << 20;  // 16 MiB
  for (const auto& [gathered, payload] :
       {std::pair{kReduced, 4 * numel}, std::pair{kReduced, 2 * numel}, std::pair{kGathered, numel / 100 * 8}}) {
    const auto choice = choose_hierarchy(measured_two_by_two(), {4, 2, 2}, gathered, numel, payload);
    EXPECT_FALSE(choice.hierarchical) << payload << ": " << choice.flat_s << " vs " << choice.hierarchical_s;
  }
  // none: flat is the world allreduce (201 ms); hierarchical 1.5 node allreduces (66 ms) + the leaders' (262 ms).
  const auto none = choose_hierarchy(measured_two_by_two(), {4, 2, 2}, kReduced, numel, 4 * numel);
  EXPECT_NEAR(none.flat_s, 2e-4 + 0.201, 1e-6);
  EXPECT_NEAR(none.hierarchical_s, 1.5 * (2e-4 + 0.044) + 2e-5 + 0.262, 1e-6);
}

TEST(HierarchyModel, NeverHierarchicalUnmeasuredOrWithoutNodes) {
  LinkModel unmeasured = large_cluster();
  unmeasured.measured = false;
  EXPECT_FALSE(choose_hierarchy(unmeasured, {64, 8, 8}, kGathered, 1 << 24, 1 << 20).hierarchical);
  EXPECT_FALSE(choose_hierarchy(large_cluster(), {8, 1, 8}, kGathered, 1 << 24, 1 << 20).hierarchical);
  EXPECT_FALSE(choose_hierarchy(large_cluster(), {8, 8, 1}, kGathered, 1 << 24, 1 << 20).hierarchical);
}

TEST(HierarchyModel, LearnedLinksGiveOneDecisionAndItsResultOnEveryRank) {
  ::setenv("GRADCOMP_LOCAL_SIZE", "2", 1);
  run_ranks(4, [](Communicator& comm) {
    NodeGroups groups = make_node_groups(comm);
    learn_links(comm, groups, 256 << 10);
    ASSERT_TRUE(groups.links.measured);
    EXPECT_EQ(groups.per_node, 2);
    const LinkModel& m = groups.links;
    std::vector<float> mine;
    for (const LinkCost* c : {&m.node_allreduce, &m.leader_allreduce, &m.leader_allgather, &m.world_allreduce,
                              &m.world_allgather}) {
      EXPECT_GT(c->bytes_per_s, 0);
      mine.push_back(static_cast<float>(c->latency_s));
      mine.push_back(static_cast<float>(c->bytes_per_s));
    }
    // The learned figures are the same on every rank (the decision depends on nothing else).
    const auto all = testing::gather_floats(comm, mine);
    for (int r = 1; r < comm.size(); ++r) {
      EXPECT_EQ(std::memcmp(all.data(), all.data() + mine.size() * r, mine.size() * 4), 0) << r;
    }
    for (const std::string spec : {"none", "topk:ratio=0.01"}) {
      auto codec = make_compressor(spec);
      const std::size_t numel = 5003;
      auto grad = testing::make_gradient(numel, comm.rank(), 0);
      AllreduceOptions options;
      options.nodes = &groups;
      options.hierarchy_auto = true;
      const auto stats = compressed_allreduce(comm, *codec, TensorView::of(std::span(grad)), "auto." + spec, options);
      // Every rank took the same mode...
      std::vector<float> took = {stats.hierarchical ? 1.0f : 0.0f};
      const auto tooks = testing::gather_floats(comm, took);
      for (float t : tooks) EXPECT_EQ(t, took[0]) << spec;
      // ...and got what that mode gives, bit for bit, with a fresh codec.
      auto again = make_compressor(spec);
      auto expected = testing::make_gradient(numel, comm.rank(), 0);
      AllreduceOptions fixed;
      fixed.nodes = &groups;
      fixed.hierarchical = stats.hierarchical;
      compressed_allreduce(comm, *again, TensorView::of(std::span(expected)), "auto." + spec, fixed);
      EXPECT_EQ(std::memcmp(grad.data(), expected.data(), numel * 4), 0) << spec;
    }
    // Without learned links the auto mode refuses, naming the tensor.
    NodeGroups bare = make_node_groups(comm);
    auto codec = make_compressor("none");
    std::vector<float> x(8, 1.0f);
    AllreduceOptions options;
    options.nodes = &bare;
    options.hierarchy_auto = true;
    try {
      compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "unlearned", options);
      ADD_FAILURE() << "auto hierarchy without learned links did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("unlearned"), std::string::npos) << e.what();
    }
  });
  ::unsetenv("GRADCOMP_LOCAL_SIZE");
}

}  // namespace
}  // namespace gradcomp
