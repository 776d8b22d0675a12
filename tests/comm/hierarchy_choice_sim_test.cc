// The auto mode's choice on the simulated clusters of docs/scaling.md: the links learn_links measured inside the
// SimGrid simulation (bench/sim/run.sh --modes auto, the learned_links row of each run; the same figures at commits
// e005f76 and 30db83c), each codec of the simulated tables, and the mode the simulation found faster (its flat and
// hierarchical runs: the 2 x 2 rows at e005f76, the ResNet-50 rows at 30db83c, 2026-12-06).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

// A measured LinkModel from its eight costs: node allreduce, broadcast; leaders allreduce, allgatherv, alltoallv;
// world allreduce, allgatherv, alltoallv ([latency s, bytes/s past the knee, knee bytes, knee s], as learned_links).
LinkModel links(const std::vector<LinkCost>& c) {
  LinkModel m;
  m.node.allreduce = c.at(0);
  m.node.broadcast = c.at(1);
  m.leaders = {c.at(2), c.at(3), c.at(4), {}};
  m.world = {c.at(5), c.at(6), c.at(7), {}};
  m.measured = true;
  return m;
}

// 2 x 2 at 1 Gbit/s (emulated-2x2-1gbit.xml)
LinkModel sim_2x2_1gbit() {
  return links({{3.018e-05, 1.201e9, 1.049e+06, 0.001149},
                {4.619e-05, 1.138e9, 1.049e+06, 0.001065},
                {0.0002254, 0.1082e9, 1.049e+06, 0.01211},
                {0.0002219, 0.1054e9, 1.049e+06, 0.01093},
                {0.000223, 0.2126e9, 1.049e+06, 0.006282},
                {0.0009483, 0.1016e9, 1.049e+06, 0.01325},
                {0.0009285, 0.02703e9, 1.049e+06, 0.04036},
                {0.0004445, 0.109e9, 1.049e+06, 0.01118}});
}

// 8 x 8 at 100 Gbit/s (gpu-8x8-100gbit.xml)
LinkModel sim_8x8_100gbit() {
  return links({{1.209e-05, 204.8e9, 1.049e+06, 0.0003311},
                {2.418e-05, 209.8e9, 1.049e+06, 0.0001447},
                {3.627e-05, 6.399e9, 1.049e+06, 0.001142},
                {8.466e-05, 1.6e9, 1.049e+06, 0.000865},
                {1.21e-05, 12.8e9, 1.049e+06, 0.0001518},
                {7.259e-05, 6.205e9, 4.194e+06, 0.001259},
                {0.0001332, 0.1778e9, 2.621e+05, 0.0059},
                {0.0007304, 1.599e9, 4.194e+06, 0.006723}});
}

// 8 x 8 at 200 Gbit/s (gpu-8x8-200gbit.xml)
LinkModel sim_8x8_200gbit() {
  return links({{1.209e-05, 204.8e9, 1.049e+06, 0.0003311},
                {2.418e-05, 209.8e9, 1.049e+06, 0.0001447},
                {3.627e-05, 12.8e9, 1.049e+06, 0.00106},
                {8.464e-05, 3.2e9, 1.049e+06, 0.0005373},
                {1.21e-05, 25.6e9, 1.049e+06, 0.0001108},
                {7.256e-05, 12.05e9, 4.194e+06, 0.0009313},
                {0.0001327, 0.3555e9, 2.621e+05, 0.005163},
                {0.0007299, 3.197e9, 4.194e+06, 0.005412}});
}

// 8 x 8 at 400 Gbit/s (gpu-8x8-400gbit.xml)
LinkModel sim_8x8_400gbit() {
  return links({{1.209e-05, 204.8e9, 1.049e+06, 0.0003311},
                {2.418e-05, 209.8e9, 1.049e+06, 0.0001447},
                {3.627e-05, 25.6e9, 1.049e+06, 0.001019},
                {8.463e-05, 6.399e9, 1.049e+06, 0.0003734},
                {1.209e-05, 51.19e9, 1.049e+06, 9.035e-05},
                {7.254e-05, 22.75e9, 4.194e+06, 0.0007674},
                {0.0001325, 0.711e9, 2.621e+05, 0.004794},
                {0.0007296, 6.387e9, 4.194e+06, 0.004756}});
}

// 32 x 8 at 100 Gbit/s (gpu-32x8-100gbit.xml; learned in the 256-rank auto run of 2026-12-06, commit 13e2c0c)
LinkModel sim_32x8_100gbit() {
  return links({{1.209e-05, 204.8e9, 1.049e+06, 0.0003311},
                {2.418e-05, 209.8e9, 1.049e+06, 0.0001447},
                {0.0001572, 5.78e9, 2.097e+06, 0.004694},
                {0.0001331, 0.3612e9, 5.243e+05, 0.003617},
                {1.217e-05, 11.56e9, 2.097e+06, 0.0002513},
                {0.0002298, 5.621e9, 1.678e+07, 0.003896},
                {0.0001565, 0.04374e9, 6.554e+04, 0.01937},
                {0.003104, 1.445e9, 1.678e+07, 0.02918}});
}

struct SimulatedRow {
  std::string spec;  // the real codec of the row (the modeled sim_* codecs have its payload sizes)
  double flat_ms;    // simulated, flat
  double hier_ms;    // simulated, hierarchical
};

// The choice for `numel` f32 elements in `rows` rows (0: a vector) of `spec`, as compressed_allreduce's auto mode
// makes it.
HierarchyChoice choice_for(const LinkModel& links, const HierarchyShape& shape, const std::string& spec,
                           std::size_t numel, std::size_t rows) {
  auto codec = make_compressor(spec);
  const AllreduceAlgorithm algorithm = resolve_algorithm(codec->traits(), AllreduceAlgorithm::kAuto);
  return choose_hierarchy(links, shape,
                          {payload_exchange(algorithm), numel, codec->expected_payload_bytes(numel, rows), 1.0});
}

// `rows`: the matrix bench/sim/run.sh gives PowerSGD (--rows).
void expect_faster_mode(const LinkModel& links, const HierarchyShape& shape, std::size_t numel, std::size_t rows,
                        const std::vector<SimulatedRow>& rows_simulated) {
  for (const SimulatedRow& row : rows_simulated) {
    const HierarchyChoice choice = choice_for(links, shape, row.spec, numel, rows);
    EXPECT_EQ(choice.hierarchical, row.hier_ms < row.flat_ms)
        << row.spec << " on " << shape.world << " ranks: predicted flat " << choice.flat_s * 1e3 << " ms, hierarchical "
        << choice.hierarchical_s * 1e3 << " ms; simulated " << row.flat_ms << " and " << row.hier_ms << " ms";
  }
}

// docs/scaling.md's validation rows: 16 MiB, the real CPU codecs, 2 hosts x 2 ranks at 1 Gbit/s. Flat everywhere.
TEST(HierarchyChoiceSimulated, TwoByTwoAtOneGbitStaysFlat) {
  expect_faster_mode(sim_2x2_1gbit(), {4, 2, 2}, std::size_t{4} << 20, 0,
                     {{"none", 170.6, 194.4},
                      {"fp16", 138.6, 162.1},
                      {"qsgd:bits=4", 165.8, 199.0},
                      {"topk:ratio=0.01", 34.0, 58.3},
                      {"dgc:ratio=0.001", 28.4, 54.0}});
}

// ResNet-50 (25.6M f32) on 8 nodes of 8 ranks, 100 Gbit/s per node: dense rings stay flat (a ring crosses each
// NIC once), qsgd's alltoallv and the sparse allgathers go hierarchical (their flat messages to other nodes all
// leave through the node's one NIC), and so do PowerSGD's rounds of 64-way alltoallvs of a few KiB.
TEST(HierarchyChoiceSimulated, SixtyFourRanksAtOneHundredGbit) {
  expect_faster_mode(sim_8x8_100gbit(), {64, 8, 8}, 25'600'000, 5000,
                     {{"none", 17.29, 18.66},
                      {"fp16", 9.04, 10.66},
                      {"qsgd:bits=4", 18.21, 4.16},
                      {"topk:ratio=0.01", 16.36, 2.79},
                      {"dgc:ratio=0.001", 6.11, 1.55},
                      {"powersgd:rank=4", 2.21, 1.97}});
}

// The same at 200 and 400 Gbit/s; there PowerSGD's two rounds of small ordered sums cost about the same either way.
TEST(HierarchyChoiceSimulated, SixtyFourRanksAtTwoHundredGbit) {
  expect_faster_mode(sim_8x8_200gbit(), {64, 8, 8}, 25'600'000, 5000,
                     {{"none", 9.29, 10.63},
                      {"fp16", 5.04, 6.65},
                      {"qsgd:bits=4", 13.57, 3.14},
                      {"topk:ratio=0.01", 10.60, 2.15},
                      {"dgc:ratio=0.001", 5.36, 1.46},
                      {"powersgd:rank=4", 2.03, 1.95}});
}

TEST(HierarchyChoiceSimulated, SixtyFourRanksAtFourHundredGbit) {
  expect_faster_mode(sim_8x8_400gbit(), {64, 8, 8}, 25'600'000, 5000,
                     {{"none", 5.29, 6.65},
                      {"fp16", 3.04, 4.65},
                      {"qsgd:bits=4", 11.25, 2.63},
                      {"topk:ratio=0.01", 7.72, 1.83},
                      {"dgc:ratio=0.001", 4.98, 1.42},
                      {"powersgd:rank=4", 1.95, 1.94}});
}

// 256 ranks (32 nodes of 8) at 100 Gbit/s: as at 64, with the flat allgathers 12x slower than the leaders' (top-k
// 115.5 against 9.6 ms).
TEST(HierarchyChoiceSimulated, TwoHundredFiftySixRanksAtOneHundredGbit) {
  expect_faster_mode(sim_32x8_100gbit(), {256, 32, 8}, 25'600'000, 5000,
                     {{"none", 19.33, 23.77},
                      {"fp16", 10.22, 13.70},
                      {"qsgd:bits=4", 24.84, 6.44},
                      {"topk:ratio=0.01", 115.54, 9.63},
                      {"dgc:ratio=0.001", 24.27, 4.20},
                      {"powersgd:rank=4", 6.86, 2.05}});
}

// The 1.3B-parameter transformer (1.3e9 f32, PowerSGD's matrix 40,000 x 32,500) on the same platform and links
// (learn_links learned the same costs in the transformer's auto run, bench/sim/run.sh --parts transformer,
// 2026-12-06): the dense rings stay flat, qsgd, top-k and DGC go hierarchical, and PowerSGD's factors (1.2 MB) stay
// flat, where the node allreduce and broadcast of 5.2 GB would cost more than its whole flat exchange. Priced at
// PowerSGD's bound (twice the tensor) instead of its factors, the choice was hierarchical (67.4 ms against 20.1).
TEST(HierarchyChoiceSimulated, TransformerOnSixtyFourRanksAtOneHundredGbit) {
  expect_faster_mode(sim_8x8_100gbit(), {64, 8, 8}, 1'300'000'000, 40'000,
                     {{"none", 849.81, 874.33},
                      {"fp16", 430.30, 468.38},
                      {"qsgd:bits=4", 495.18, 170.91},
                      {"topk:ratio=0.01", 634.46, 103.60},
                      {"dgc:ratio=0.001", 87.46, 40.69},
                      {"powersgd:rank=4", 20.13, 67.43}});
}

}  // namespace
}  // namespace gradcomp
