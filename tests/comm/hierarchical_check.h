// Hierarchical compressed_allreduce against an independent reference, on any communicator (comm/local threads or MPI
// ranks): every rank rebuilds the exact composition from every rank's input: each node's f32 sum (exact: the inputs lie
// on a 2^-16 grid), divided by the world size, then the codec's flat algorithm across the node leaders
// (tests/comm/flat_reference.h, one twin per leader kept across steps; PowerSGD: tests/comm/rounds_reference.h over
// the leaders' inputs), within the flat checks' bounds; and every rank ends bit-identical.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "tests/comm/allreduce_check.h"
#include "tests/comm/flat_reference.h"
#include "tests/comm/rounds_reference.h"

namespace gradcomp::testing {

// `steps` hierarchical allreduces of `spec` over `world` (nodes from `groups`) of a rows x cols tensor, each checked
// against the reference on every rank.
inline void check_hierarchical(Communicator& world, NodeGroups& groups, const std::string& spec, std::size_t rows,
                               std::size_t cols, int steps = 2, ReduceOp op = ReduceOp::kAverage) {
  const auto nodes = node_members(world, groups);
  const int leaders = static_cast<int>(nodes.size());
  ASSERT_EQ(leaders, groups.node_count);
  const std::size_t numel = rows * cols;
  const std::string name = "hier";
  auto codec = make_compressor(spec);
  const CompressorTraits traits = codec->traits();
  const AllreduceAlgorithm algorithm = resolve_algorithm(traits, AllreduceAlgorithm::kAuto);
  auto twins = make_twins(spec, leaders);
  std::optional<RoundsReference> lowrank;
  if (algorithm == AllreduceAlgorithm::kRounds) {
    lowrank = RoundsReference::make(*codec, name, rows, cols, leaders);
    ASSERT_TRUE(lowrank && lowrank->compresses()) << spec << ": no low-rank reference for " << rows << "x" << cols;
  }
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("spec {} step {} rank {} of {} ({} nodes)", spec, step, world.rank(), world.size(),
                             leaders));
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < world.size(); ++r) inputs.push_back(on_grid(make_gradient(numel, r, step, 5)));
    std::vector<float> tensor = inputs[world.rank()];
    AllreduceOptions options;
    options.op = op;
    options.step = step;
    options.hierarchical = true;
    options.nodes = &groups;
    const auto stats = compressed_allreduce(world, *codec, TensorView::of(std::span(tensor)).with_rows(rows), name,
                                            options);
    EXPECT_TRUE(stats.hierarchical);
    EXPECT_EQ(stats.algorithm, algorithm);
    const auto node_sums = leader_inputs(inputs, nodes, op);
    if (lowrank) {
      EXPECT_LT(relative_error(tensor, lowrank->step(node_sums, step, /*average=*/false)), 1e-4 * leaders);
    } else {
      const Expected ref = flat_reference(twins, node_sums, name, step, algorithm, ReduceOp::kSum);
      const auto bounds = element_bounds(ref.values, ref.magnitude, algorithm, traits.wire_dtype, leaders);
      double max_error = 0;
      EXPECT_EQ(count_outside(tensor, ref.values, bounds, &max_error), 0u) << "max error " << max_error;
    }
    const auto all = gather_floats(world, tensor);
    for (int r = 1; r < world.size(); ++r) {
      EXPECT_EQ(std::memcmp(all.data(), all.data() + r * numel, numel * sizeof(float)), 0) << "rank " << r;
    }
  }
}

}  // namespace gradcomp::testing
