// The hierarchical `auto` mode: the cost model's choice on known link costs, and on 4 in-process ranks in 2 emulated
// nodes the learned links, one decision on every rank, and results equal to the mode it chose.
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

LinkModel links(double intra_bytes_per_s, double inter_bytes_per_s) {
  LinkModel model;
  model.intra = {5e-6, intra_bytes_per_s};
  model.inter = {50e-6, inter_bytes_per_s};
  model.measured = true;
  return model;
}

CompressorTraits summable() {
  CompressorTraits t;
  t.summable = true;
  return t;
}

CompressorTraits gatherable() {
  CompressorTraits t;
  t.gatherable = true;
  t.lossy = true;
  return t;
}

TEST(HierarchyModel, DenseOnFastNodesAndASlowNetworkGoesHierarchical) {
  const std::size_t numel = std::size_t{16} << 20;  // 64 MiB of f32
  // 8 nodes x 8 ranks, NVLink-like inside (100 GB/s), 10 Gbit/s between: flat pays 2(63)/64 of the tensor on the
  // slow links, hierarchical 2(7)/8 of it.
  const auto choice = choose_hierarchy(links(100e9, 1.25e9), {64, 8, 8}, summable(), numel, 4 * numel);
  EXPECT_TRUE(choice.hierarchical) << choice.flat_s << " vs " << choice.hierarchical_s;
  EXPECT_LT(choice.hierarchical_s, choice.flat_s);
  EXPECT_NEAR(choice.flat_s, 2.0 * 63 * (50e-6 + 4.0 * numel / 64 / 1.25e9), 1e-9);
}

TEST(HierarchyModel, SparsePayloadOnSlowNodesStaysFlat) {
  const std::size_t numel = std::size_t{4} << 20;  // 16 MiB
  // A top-k 1% payload (8-byte pairs) is 1/50 of the tensor: the node's dense f32 stage over a slow intra link
  // (100 MB/s, loopback under load) costs more than the whole flat allgather.
  const auto choice = choose_hierarchy(links(100e6, 125e6), {4, 2, 2}, gatherable(), numel, numel / 100 * 8);
  EXPECT_FALSE(choice.hierarchical) << choice.flat_s << " vs " << choice.hierarchical_s;
  EXPECT_GT(choice.hierarchical_s, choice.flat_s);
}

TEST(HierarchyModel, NeverHierarchicalUnmeasuredOrWithoutNodes) {
  LinkModel unmeasured = links(100e9, 1e6);
  unmeasured.measured = false;
  EXPECT_FALSE(choose_hierarchy(unmeasured, {64, 8, 8}, summable(), 1 << 24, 4 << 24).hierarchical);
  EXPECT_FALSE(choose_hierarchy(links(100e9, 1e6), {8, 1, 8}, summable(), 1 << 24, 4 << 24).hierarchical);
  EXPECT_FALSE(choose_hierarchy(links(100e9, 1e6), {8, 8, 1}, summable(), 1 << 24, 4 << 24).hierarchical);
}

TEST(HierarchyModel, LearnedLinksGiveOneDecisionAndItsResultOnEveryRank) {
  ::setenv("GRADCOMP_LOCAL_SIZE", "2", 1);
  run_ranks(4, [](Communicator& comm) {
    NodeGroups groups = make_node_groups(comm);
    learn_links(comm, groups, 256 << 10);
    ASSERT_TRUE(groups.links.measured);
    EXPECT_EQ(groups.per_node, 2);
    EXPECT_GT(groups.links.intra.bytes_per_s, 0);
    EXPECT_GT(groups.links.inter.bytes_per_s, 0);
    // The learned figures are the same on every rank (the decision depends on nothing else).
    std::vector<float> mine = {static_cast<float>(groups.links.intra.latency_s),
                               static_cast<float>(groups.links.intra.bytes_per_s),
                               static_cast<float>(groups.links.inter.latency_s),
                               static_cast<float>(groups.links.inter.bytes_per_s)};
    const auto all = testing::gather_floats(comm, mine);
    for (int r = 1; r < comm.size(); ++r) EXPECT_EQ(std::memcmp(all.data(), all.data() + 4 * r, 16), 0) << r;
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
