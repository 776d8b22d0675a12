// compressed_allreduce under mpirun: the same reference checks as on comm/local, every algorithm and codec, sizes
// not divisible by the rank count, 0 and 1 elements; agreement failures; hierarchical with GRADCOMP_LOCAL_SIZE against
// its own reference (tests/comm/hierarchical_check.h), every codec.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "tests/comm/allreduce_check.h"
#include "tests/comm/hierarchical_check.h"
#include "tests/comm/mpi_world.h"

namespace gradcomp {
namespace {

using testing::check_allreduce;
using testing::mpi_world;

const AllreduceAlgorithm kAlgorithms[] = {AllreduceAlgorithm::kAuto, AllreduceAlgorithm::kDense,
                                          AllreduceAlgorithm::kAllgather, AllreduceAlgorithm::kSparseAllreduce,
                                          AllreduceAlgorithm::kScatterReduceAllgather};

TEST(MpiAllreduce, EveryAlgorithmCodecAndSizeMatchesTheReference) {
  Communicator& comm = mpi_world();
  for (auto algorithm : kAlgorithms) {
    for (const std::string& spec : testing::registered_specs()) {
      if (algorithm == AllreduceAlgorithm::kDense && !make_compressor(spec)->traits().summable) continue;
      for (std::size_t numel : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1001},
                                std::size_t{100003}}) {
        SCOPED_TRACE(fmt::format("spec {} algorithm {} numel {}", spec, algorithm_name(algorithm), numel));
        check_allreduce(comm, spec, algorithm, numel, 2);
      }
    }
  }
}

TEST(MpiAllreduce, SparseSwitch) {
  Communicator& comm = mpi_world();
  auto stats = check_allreduce(comm, "none", AllreduceAlgorithm::kSparseAllreduce, 3000, 1);
  EXPECT_TRUE(stats.switched_to_dense);
  stats = check_allreduce(comm, "none", AllreduceAlgorithm::kSparseAllreduce, 3000, 1, ReduceOp::kSum, 100.0);
  EXPECT_FALSE(stats.switched_to_dense);
}

// A tensor's sum is the same bits fused or alone at every rank count for every codec whose exchange adds in rank
// order: sparse codecs (a 6-element tensor switches to dense alone, its header outweighing its values, but not inside
// a fused buffer: both sums go in rank order), the requantizing codecs and PowerSGD's rounds. Only the summable codecs
// are summed by MPI, in an order that depends on the buffer.
TEST(MpiAllreduce, FusedEqualsAloneBitForBit) {
  Communicator& comm = mpi_world();
  const std::size_t small = 6, large = 3001;
  for (const std::string& spec : testing::registered_specs()) {
    auto alone_codec = make_compressor(spec);
    if (alone_codec->traits().summable && comm.size() > 2) continue;
    SCOPED_TRACE(spec);
    auto fused_codec = make_compressor(spec);
    for (std::uint64_t step = 0; step < 3; ++step) {
      auto a = testing::make_gradient(small, comm.rank(), step);
      auto b = testing::make_gradient(large, comm.rank(), step + 10);
      std::vector<float> fused(a);
      fused.insert(fused.end(), b.begin(), b.end());
      AllreduceOptions options;
      options.step = step;
      compressed_allreduce(comm, *alone_codec, TensorView::of(std::span(a)), "small", options);
      compressed_allreduce(comm, *alone_codec, TensorView::of(std::span(b)), "large", options);
      const TensorSegment segments[] = {{.name = "small", .offset = 0, .numel = small},
                                        {.name = "large", .offset = small, .numel = large}};
      options.segments = segments;
      compressed_allreduce(comm, *fused_codec, TensorView::of(std::span(fused)), "bucket", options);
      ASSERT_EQ(0, std::memcmp(fused.data(), a.data(), small * sizeof(float))) << "small tensor, step " << step;
      ASSERT_EQ(0, std::memcmp(fused.data() + small, b.data(), large * sizeof(float))) << "large tensor, step " << step;
    }
  }
}

TEST(MpiAllreduce, MismatchRaisesOnEveryRank) {
  Communicator& comm = mpi_world();
  auto codec = make_compressor(comm.rank() == comm.size() - 1 ? "none:nonfinite=skip" : "none");
  std::vector<float> x(comm.rank() == comm.size() - 1 ? 11 : 10, 1.0f);
  try {
    compressed_allreduce(comm, *codec, TensorView::of(std::span(x)), "w");
    ADD_FAILURE() << "no error on rank " << comm.rank();
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("numel=10"), std::string::npos) << what;
    EXPECT_NE(what.find("numel=11"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("rank {}", comm.size() - 1)), std::string::npos) << what;
  }
  // The communicator is still usable afterwards.
  check_allreduce(comm, "none", AllreduceAlgorithm::kAuto, 10, 1);
}

TEST(MpiAllreduce, HierarchicalWithEmulatedNodes) {
  Communicator& comm = mpi_world();
  // A fresh communicator (node_color() is computed once per communicator) sees nodes of 2 ranks.
  auto child = comm.split(0, comm.rank());
  ::setenv("GRADCOMP_LOCAL_SIZE", "2", 1);
  NodeGroups groups = make_node_groups(*child);
  ::unsetenv("GRADCOMP_LOCAL_SIZE");
  EXPECT_EQ(groups.node->size(), comm.rank() / 2 * 2 + 2 <= comm.size() ? 2 : 1);
  EXPECT_EQ(groups.leaders != nullptr, comm.rank() % 2 == 0);
  EXPECT_EQ(groups.node_count, (comm.size() + 1) / 2);
  for (const std::string& spec : testing::registered_specs()) testing::check_hierarchical(*child, groups, spec, 32, 64);
  testing::check_hierarchical(*child, groups, "topk:ratio=0.05", 1, 2049, 2, ReduceOp::kSum);
}

// Inside a node the leader hands on the leaders' gathered top-k payloads, not their f32 sum: it sends the node's ring
// (the f32 tensor once, nodes of 2), its payload to the other leaders and the gathered payloads, far below the ring
// plus the f32 broadcast it sent before. The other ranks decode the same payloads: check_hierarchical above checks
// their values and bits for every codec.
TEST(MpiAllreduce, HierarchicalSparseBroadcastsPayloadsInsideTheNode) {
  Communicator& comm = mpi_world();
  auto child = comm.split(0, comm.rank());
  ::setenv("GRADCOMP_LOCAL_SIZE", "2", 1);
  NodeGroups groups = make_node_groups(*child);
  ::unsetenv("GRADCOMP_LOCAL_SIZE");
  const std::size_t numel = 64 * 1024;
  std::vector<float> tensor = testing::make_gradient(numel, comm.rank(), 0, 5);
  auto codec = make_compressor("topk:ratio=0.01");
  AllreduceOptions options;
  options.op = ReduceOp::kSum;
  options.hierarchical = true;
  options.nodes = &groups;
  const auto stats = compressed_allreduce(*child, *codec, TensorView::of(std::span(tensor)), "node-payloads", options);
  EXPECT_FALSE(stats.switched_to_dense);
  if (groups.node->rank() == 0 && groups.node->size() == 2) {
    EXPECT_LT(stats.wire_bytes, numel * sizeof(float) * 5 / 4) << "rank " << comm.rank();
  }
}

}  // namespace
}  // namespace gradcomp
