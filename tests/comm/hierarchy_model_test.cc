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

// Costs fitted to 2 emulated hosts x 2 ranks at 1 Gbit/s on this VM (bench/net/hierarchy_table.sh, 16 MiB): a world
// allreduce 201 ms, a node allreduce 44 ms, an allreduce between the 2 leaders 262 ms (MPI moves more bytes per rank
// for 2 ranks than its 4-rank ring does), allgathers of 1 Gbit/s shared by the ranks of a host. (Broadcasts and
// alltoallvs were not measured there: a broadcast as half a node allreduce, an alltoallv at the allgather's rate.)
LinkModel measured_two_by_two() {
  const double s = 16.0 * (1 << 20);
  LinkModel m;
  m.node.allreduce = {2e-4, s / 0.044};
  m.node.broadcast = {2e-4, s / 0.022};
  m.leaders.allreduce = {2e-5, s / 0.262};
  m.leaders.allgatherv = {2e-5, 125e6};
  m.leaders.alltoallv = {2e-5, 125e6};
  m.world.allreduce = {2e-4, s / 0.201};
  m.world.allgatherv = {2e-4, 125e6 / 3};
  m.world.alltoallv = {2e-4, 125e6 / 3};
  m.measured = true;
  return m;
}

// 8 nodes x 8 ranks, fast inside (50 GB/s), 10 Gbit/s between: an allgather over the world receives 63 payloads
// through each host's link, one between leaders 7.
LinkModel large_cluster() {
  LinkModel m;
  m.node.allreduce = {1e-5, 50e9};
  m.node.broadcast = {1e-5, 100e9};
  m.leaders.allreduce = {1e-4, 1.25e9 / 2};
  m.leaders.allgatherv = {1e-4, 1.25e9 / 7};
  m.leaders.alltoallv = {1e-4, 1.25e9};
  m.world.allreduce = {1e-3, 1.25e9 / 2};
  m.world.allgatherv = {1e-3, 1.25e9 / 63};
  m.world.alltoallv = {1e-3, 1.25e9 / 8};
  m.measured = true;
  return m;
}

CostedCall call_of(PayloadExchange exchange, std::size_t numel, std::size_t payload) {
  return {exchange, numel, payload, 1.0};
}

TEST(HierarchyModel, SparsePayloadsOnALargeClusterGoHierarchical) {
  const std::size_t numel = std::size_t{16} << 20;
  const std::size_t payload = numel / 100 * 8;  // top-k 1%: (index, value) pairs
  const auto choice = choose_hierarchy(large_cluster(), {64, 8, 8}, call_of(PayloadExchange::kSparse, numel, payload));
  EXPECT_TRUE(choice.hierarchical) << choice.flat_s << " vs " << choice.hierarchical_s;
  // the sizes' allgather (8 bytes), then the payloads'
  EXPECT_NEAR(choice.flat_s, 1e-3 + 8 * 63 / 1.25e9 + 1e-3 + payload * 63 / 1.25e9, 1e-9);
}

// Inside the node the leader broadcasts the leaders' payloads where their sum is decoded from them, the f32 tensor
// otherwise (past the sparse switch, and for every other exchange).
TEST(HierarchyModel, TheNodeBroadcastCarriesTheGatheredPayloads) {
  const std::size_t numel = std::size_t{16} << 20;
  const double dense = 4.0 * numel;
  const LinkModel links = large_cluster();
  const double node_sum = links.node.allreduce.time(dense);
  const std::size_t payload = numel / 100 * 8;
  for (PayloadExchange exchange : {PayloadExchange::kSparse, PayloadExchange::kAllgather}) {
    const CostedCall call = call_of(exchange, numel, payload);
    const auto choice = choose_hierarchy(links, {64, 8, 8}, call);
    EXPECT_NEAR(choice.hierarchical_s,
                node_sum + exchange_time(links.leaders, 8, call) + links.node.broadcast.time(8.0 * payload), 1e-12);
  }
  // 8 payloads of 40% density each are past the switch between the leaders: the f32 sum is broadcast.
  const CostedCall dense_call = call_of(PayloadExchange::kSparse, numel, numel * 4 / 10 * 8);
  EXPECT_NEAR(choose_hierarchy(links, {64, 8, 8}, dense_call).hierarchical_s,
              node_sum + exchange_time(links.leaders, 8, dense_call) + links.node.broadcast.time(dense), 1e-12);
  const CostedCall sra = call_of(PayloadExchange::kScatterReduceAllgather, numel, numel / 2);
  EXPECT_NEAR(choose_hierarchy(links, {64, 8, 8}, sra).hierarchical_s,
              node_sum + exchange_time(links.leaders, 8, sra) + links.node.broadcast.time(dense), 1e-12);
}

TEST(HierarchyModel, TheMeasuredTwoByTwoStaysFlat) {
  const std::size_t numel = std::size_t{4} << 20;  // 16 MiB
  for (const auto& [exchange, payload] :
       {std::pair{PayloadExchange::kAllreduce, 4 * numel}, std::pair{PayloadExchange::kAllreduce, 2 * numel},
        std::pair{PayloadExchange::kSparse, numel / 100 * 8},
        std::pair{PayloadExchange::kScatterReduceAllgather, numel / 2}}) {
    const auto choice = choose_hierarchy(measured_two_by_two(), {4, 2, 2}, call_of(exchange, numel, payload));
    EXPECT_FALSE(choice.hierarchical) << payload << ": " << choice.flat_s << " vs " << choice.hierarchical_s;
  }
  // none: flat is the world allreduce (201 ms); hierarchical a node allreduce (44 ms) and broadcast (22 ms), and the
  // leaders' allreduce (262 ms).
  const auto none =
      choose_hierarchy(measured_two_by_two(), {4, 2, 2}, call_of(PayloadExchange::kAllreduce, numel, 4 * numel));
  EXPECT_NEAR(none.flat_s, 2e-4 + 0.201, 1e-6);
  EXPECT_NEAR(none.hierarchical_s, 2e-4 + 0.044 + 2e-4 + 0.022 + 2e-5 + 0.262, 1e-6);
}

// A cost through three points: linear from the tiny call to the knee, then at the marginal rate.
TEST(HierarchyModel, LinkCostIsLinearToTheKneeThenAtItsRate) {
  const LinkCost c{1e-3, 1e9, 1e6, 3e-3};
  EXPECT_DOUBLE_EQ(c.time(0), 1e-3);
  EXPECT_DOUBLE_EQ(c.time(5e5), 2e-3);
  EXPECT_DOUBLE_EQ(c.time(1e6), 3e-3);
  EXPECT_DOUBLE_EQ(c.time(3e6), 5e-3);
  const LinkCost line{1e-3, 1e9};
  EXPECT_DOUBLE_EQ(line.time(2e6), 3e-3);
  EXPECT_DOUBLE_EQ(LinkCost{}.time(1e9), 0);
}

// Each exchange is priced by the collectives it runs: sra an alltoallv and an allgatherv of one chunk, the sparse
// switch past its break-even an ordered f32 sum, rounds two ordered sums of half the payload.
TEST(HierarchyModel, ExchangesArePricedByTheirCollectives) {
  LevelCosts level;
  level.allreduce = {1e-3, 1e9};
  level.allgatherv = {2e-3, 0.5e9};
  level.alltoallv = {3e-3, 0.25e9};
  const int n = 8;
  const std::size_t numel = 1000000;
  EXPECT_DOUBLE_EQ(exchange_time(level, n, call_of(PayloadExchange::kAllreduce, numel, 2e6)), 1e-3 + 2e-3);
  const double sizes = 2e-3 + 8 / 0.5e9;
  EXPECT_DOUBLE_EQ(exchange_time(level, n, call_of(PayloadExchange::kAllgather, numel, 1e5)),
                   sizes + 2e-3 + 1e5 / 0.5e9);
  EXPECT_DOUBLE_EQ(exchange_time(level, n, call_of(PayloadExchange::kSparse, numel, 1e5)), sizes + 2e-3 + 1e5 / 0.5e9);
  // 8 payloads of 1.1 MB > 8 bytes x 1M elements: the dense switch
  EXPECT_DOUBLE_EQ(exchange_time(level, n, call_of(PayloadExchange::kSparse, numel, 1.1e6)),
                   sizes + 3e-3 + 4e6 / 0.25e9 + 2e-3 + 4e6 / n / 0.5e9);
  EXPECT_DOUBLE_EQ(exchange_time(level, n, call_of(PayloadExchange::kScatterReduceAllgather, numel, 8e5)),
                   3e-3 + 8.0 * n / 0.25e9 + 3e-3 + 8e5 / 0.25e9 + 2e-3 + 1e5 / 0.5e9 + sizes);
  EXPECT_DOUBLE_EQ(exchange_time(level, n, call_of(PayloadExchange::kRounds, numel, 8e4)),
                   2 * (3e-3 + 4e4 / 0.25e9 + 2e-3 + 5e3 / 0.5e9));
  EXPECT_EQ(exchange_time(level, 1, call_of(PayloadExchange::kAllreduce, numel, 2e6)), 0);
}

TEST(HierarchyModel, NeverHierarchicalUnmeasuredOrWithoutNodes) {
  LinkModel unmeasured = large_cluster();
  unmeasured.measured = false;
  const CostedCall sparse = call_of(PayloadExchange::kSparse, 1 << 24, 1 << 20);
  EXPECT_FALSE(choose_hierarchy(unmeasured, {64, 8, 8}, sparse).hierarchical);
  EXPECT_FALSE(choose_hierarchy(large_cluster(), {8, 1, 8}, sparse).hierarchical);
  EXPECT_FALSE(choose_hierarchy(large_cluster(), {8, 8, 1}, sparse).hierarchical);
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
    const std::vector<const LinkCost*> measured = {&m.node.allreduce,      &m.node.broadcast,
                                                   &m.leaders.allreduce,   &m.leaders.allgatherv,
                                                   &m.leaders.alltoallv,   &m.world.allreduce,
                                                   &m.world.allgatherv,    &m.world.alltoallv};
    for (const LinkCost* c : measured) {
      EXPECT_GT(c->bytes_per_s, 0);
      EXPECT_GT(c->knee_bytes, 0);
      mine.push_back(static_cast<float>(c->latency_s));
      mine.push_back(static_cast<float>(c->bytes_per_s));
      mine.push_back(static_cast<float>(c->knee_s));
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
