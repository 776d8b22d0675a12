// Runtime::join() on comm/local (ranks as threads): a joined rank serves the others' tensors with zeros, the flag
// costs no collective before anyone joins, join() returns the rank that joined last, mismatches still fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

RuntimeOptions join_options(int lanes) {
  RuntimeOptions options;
  options.timeline_path = "";
  options.cycle_time_ms = 1;
  options.pipeline_lanes = lanes;
  return options;
}

// Small integers: sums and the division by a power-of-two rank count are exact.
float value_of(int rank, int step, int tensor, std::size_t i) {
  return static_cast<float>(rank + 2 * step + tensor + static_cast<int>(i % 7));
}

constexpr std::size_t kNumel = 300;

// join()'s result on each rank of one run. Where the ranks' join() calls do not wait on each other they may land in
// different cycles, so which rank joined last is not fixed; every rank must still return the same one.
class JoinResults {
 public:
  explicit JoinResults(int size) : values_(static_cast<std::size_t>(size), -1) {}
  void record(const Communicator& comm, int value) { values_[static_cast<std::size_t>(comm.rank())] = value; }
  void expect_agreed_on_one_of(const std::vector<int>& allowed) const {
    for (std::size_t r = 0; r < values_.size(); ++r) {
      EXPECT_EQ(values_[r], values_[0]) << "rank " << r << " and rank 0 disagree on the last rank to join";
    }
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), values_[0]), allowed.end())
        << "join() returned " << values_[0];
  }

 private:
  std::vector<int> values_;
};

// Rank r submits 2 + r steps of three tensors (fused), then joins; each step's result is the sum of the ranks still
// stepping, divided by the world size (Horovod's join).
void uneven_steps(Communicator& comm, Runtime& rt, const SubmitOptions& submit) {
  const int size = comm.size();
  const int steps = 2 + comm.rank();
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> data(3, std::vector<float>(kNumel));
    std::vector<Handle> handles;
    for (int t = 0; t < 3; ++t) {
      for (std::size_t i = 0; i < kNumel; ++i) data[t][i] = value_of(comm.rank(), step, t, i);
      handles.push_back(rt.allreduce_async(fmt::format("layer{}", t), TensorView::of(std::span<float>(data[t])),
                                           submit));
    }
    for (Handle h : handles) rt.wait(h);
    for (int t = 0; t < 3; ++t) {
      for (std::size_t i = 0; i < kNumel; ++i) {
        float expected = 0;
        for (int r = 0; r < size; ++r) {
          if (step < 2 + r) expected += value_of(r, step, t, i);
        }
        ASSERT_EQ(data[t][i], expected / static_cast<float>(size))
            << "rank " << comm.rank() << " step " << step << " tensor " << t << " element " << i;
      }
    }
  }
  EXPECT_EQ(rt.join(), size - 1) << "rank " << size - 1 << " steps longest";
}

TEST(RuntimeJoin, JoinedRanksServeTheOthersWithZeros) {
  for (int lanes : {0, 2}) {
    run_ranks(4, [&](Communicator& comm) {
      Runtime rt(comm, join_options(lanes));
      uneven_steps(comm, rt, SubmitOptions{.spec = "none"});
    });
  }
}

// A tensor reduced in parts (RuntimeOptions::partition_bytes: each 1,200-byte tensor in four parts, alone) is
// served by a joined rank part by part, as the ranks still stepping cut it.
TEST(RuntimeJoin, JoinedRanksServeAPartitionedTensor) {
  for (const char* spec : {"none", "fp16"}) {
    SCOPED_TRACE(spec);
    run_ranks(4, [&](Communicator& comm) {
      RuntimeOptions options = join_options(2);
      options.fusion_threshold_bytes = 0;
      options.partition_bytes = kNumel * sizeof(float) / 4;
      Runtime rt(comm, options);
      uneven_steps(comm, rt, SubmitOptions{.spec = spec});
      std::size_t parts = 0;
      for (const BufferRecord& buffer : rt.stats().buffers) parts += buffer.input_bytes == kNumel;
      EXPECT_GT(parts, 0u) << "no tensor went in parts on rank " << comm.rank();
    });
  }
}

TEST(RuntimeJoin, JoinedRanksServeAnOwnersScope) {
  run_ranks(4, [&](Communicator& comm) {
    Runtime rt(comm, join_options(2));
    std::unique_ptr<Compressor> owned = make_compressor("none");
    uneven_steps(comm, rt, SubmitOptions{.compressor = owned.get(), .scope = "opt"});
  });
}

// A shape-aware codec (PowerSGD compresses the rows x cols matrix, and sizes its rounds by it) is served with zeros
// of the same matrix: the others' results equal those of a run in which rank 0 submits that matrix of zeros itself.
TEST(RuntimeJoin, JoinedRanksServeTheMatrixOfAShapeAwareCodec) {
  constexpr std::size_t kRows = 12;
  const auto run = [&](bool rank0_joins) {
    std::vector<std::vector<float>> out(3);
    run_ranks(3, [&](Communicator& comm) {
      Runtime rt(comm, join_options(0));
      std::vector<float> x(kNumel, 0.0f);
      if (comm.rank() != 0) {
        for (std::size_t i = 0; i < kNumel; ++i) x[i] = value_of(comm.rank(), 0, 0, i);
      }
      if (comm.rank() != 0 || !rank0_joins) {
        rt.wait(rt.allreduce_async("w", TensorView::of(std::span<float>(x)).with_rows(kRows),
                                   SubmitOptions{.spec = "powersgd:rank=2"}));
      }
      rt.join();
      out[static_cast<std::size_t>(comm.rank())] = x;
    });
    return out;
  };
  const auto joined = run(true);
  const auto submitted = run(false);
  for (std::size_t r : {1u, 2u}) EXPECT_EQ(joined[r], submitted[r]) << "rank " << r;
  EXPECT_NE(submitted[1], std::vector<float>(kNumel, 0.0f));
}

TEST(RuntimeJoin, NamesFirstSubmittedAfterAJoinAreNegotiated) {
  // Rank 0 joins before anything was submitted: the others' names are new (announced) and run without it.
  JoinResults joined(3);
  run_ranks(3, [&](Communicator& comm) {
    Runtime rt(comm, join_options(0));
    if (comm.rank() != 0) {
      std::vector<float> x(kNumel, static_cast<float>(comm.rank()));
      rt.wait(rt.allreduce_async("fresh", TensorView::of(std::span<float>(x)), SubmitOptions{.op = ReduceOp::kSum}));
      for (float v : x) ASSERT_EQ(v, 3.0f);
    }
    joined.record(comm, rt.join());
  });
  joined.expect_agreed_on_one_of({1, 2});  // ranks 1 and 2 join after rank 0
}

TEST(RuntimeJoin, EveryRankJoiningAtOnceAgreesOnTheLastAndJoinRepeats) {
  JoinResults first(3), again(3);
  run_ranks(3, [&](Communicator& comm) {
    Runtime rt(comm, join_options(0));
    first.record(comm, rt.join());
    again.record(comm, rt.join());  // the flag was cleared everywhere at the same cycle
    std::vector<float> x(8, 1.0f);
    rt.wait(rt.allreduce_async("after", TensorView::of(std::span<float>(x)), SubmitOptions{.op = ReduceOp::kSum}));
    for (float v : x) ASSERT_EQ(v, 3.0f);
  });
  first.expect_agreed_on_one_of({0, 1, 2});
  again.expect_agreed_on_one_of({0, 1, 2});
}

TEST(RuntimeJoin, NoCollectiveIsAddedUntilARankJoins) {
  // Steady state: one negotiation collective per cycle, announcements aside, with or without join support.
  JoinResults joined(2);
  run_ranks(2, [&](Communicator& comm) {
    Runtime rt(comm, join_options(0));
    std::vector<float> x(kNumel, 1.0f);
    rt.wait(rt.allreduce_async("w", TensorView::of(std::span<float>(x))));  // announced once: 1 + 2 collectives
    (void)rt.take_stats();
    for (int step = 0; step < 20; ++step) rt.wait(rt.allreduce_async("w", TensorView::of(std::span<float>(x))));
    const RuntimeStats stats = rt.take_stats();
    EXPECT_EQ(stats.negotiation_collectives, stats.cycles);
    EXPECT_EQ(stats.messages, 20u);
    joined.record(comm, rt.join());
  });
  joined.expect_agreed_on_one_of({0, 1});
}

TEST(RuntimeJoin, MismatchAmongTheRanksNotJoinedStillFailsOnEach) {
  JoinResults joined(3);
  run_ranks(3, [&](Communicator& comm) {
    Runtime rt(comm, join_options(0));
    if (comm.rank() != 0) {
      std::vector<float> x(comm.rank() == 1 ? 10 : 12, 1.0f);
      try {
        rt.wait(rt.allreduce_async("bad", TensorView::of(std::span<float>(x))));
        ADD_FAILURE() << "rank " << comm.rank() << ": a size mismatch was not refused";
      } catch (const InvalidArgument& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("'bad'"), std::string::npos) << message;
        EXPECT_NE(message.find("rank 1 has f32[10]"), std::string::npos) << message;
        EXPECT_NE(message.find("rank 2 has f32[12]"), std::string::npos) << message;
      }
    }
    joined.record(comm, rt.join());
  });
  joined.expect_agreed_on_one_of({0, 1, 2});
}

}  // namespace
}  // namespace gradcomp
