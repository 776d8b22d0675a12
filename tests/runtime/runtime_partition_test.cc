// Partitioning (RuntimeOptions::partition_bytes): a large tensor that travels alone under none, fp16 or bf16 is
// reduced in parts on the pipeline's lanes. Every element gets the bits it gets unpartitioned, the codec's
// error-feedback state is the same, the handle completes once with its tensor's error when a part fails, and the
// tensors that must not be cut (nonfinite=skip, other codecs, one lane) travel whole.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "src/runtime/partition.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

// One tensor far above the partition size (400 KB: 7 parts of 64 KiB), one just below twice it, two small ones.
constexpr std::size_t kPartBytes = 64 << 10;
const std::vector<std::size_t> kSizes = {100000, 30000, 37, 5000};

RuntimeOptions options_with(std::size_t partition_bytes, int lanes = 2) {
  RuntimeOptions options;
  options.pipeline_lanes = lanes;
  options.partition_bytes = partition_bytes;
  options.fusion_tensor_limit_bytes = 16 << 10;
  options.timeline_path = "";
  return options;
}

struct Outcome {
  std::vector<std::vector<std::uint32_t>> bits;  // every tensor of every step
  std::vector<float> residual;                   // the large tensor's error feedback after the last step
  std::vector<BufferRecord> buffers;             // every buffer of the last step
};

// Three steps of kSizes under `spec`; the large tensor gets a larger scale than fp16's precision keeps exactly.
Outcome run(Communicator& comm, const std::string& spec, const RuntimeOptions& options) {
  Runtime rt(comm, options);
  Outcome outcome;
  for (int step = 0; step < 3; ++step) {
    rt.take_stats();
    std::vector<std::vector<float>> data(kSizes.size());
    std::mt19937 rng(5 + 1000 * comm.rank() + step);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      data[t].resize(kSizes[t]);
      for (float& v : data[t]) v = normal(rng) * (t == 0 ? 3.7f : 1.0f);
      rt.allreduce_async(fmt::format("layer{}", t), TensorView::of(std::span<float>(data[t])), spec);
    }
    rt.synchronize();
    for (const auto& tensor : data) {
      std::vector<std::uint32_t> bits(tensor.size());
      for (std::size_t i = 0; i < tensor.size(); ++i) bits[i] = std::bit_cast<std::uint32_t>(tensor[i]);
      outcome.bits.push_back(std::move(bits));
    }
    outcome.buffers = rt.take_stats().buffers;
  }
  outcome.residual = rt.residual("layer0");
  return outcome;
}

std::size_t buffers_of(const std::vector<BufferRecord>& buffers, std::size_t at_least_bytes) {
  std::size_t count = 0;
  for (const BufferRecord& buffer : buffers) count += buffer.input_bytes >= at_least_bytes ? 1 : 0;
  return count;
}

// The plan alone: how many parts, and that the parts cover the tensor exactly, in order, as ranges of it.
TEST(Plan, CountsAndRanges) {
  std::vector<float> values(1000);
  auto prepared_for = [&](Compressor& codec, std::size_t numel) {
    runtime::Executor::Prepared prepared;
    runtime::Executor::Member member;
    member.name = "w";
    member.tensor = TensorView::of(std::span<float>(values.data(), numel));
    member.step = 3;
    prepared.members = {member};
    prepared.group.numel = numel;
    prepared.group.bytes = numel * sizeof(float);
    prepared.group.offsets = {0};
    prepared.compressor = &codec;
    return prepared;
  };
  auto none = make_compressor("none");
  const auto whole = prepared_for(*none, 1000);
  EXPECT_EQ(runtime::partition_count(whole, 0, AllreduceAlgorithm::kAuto), 1u) << "0 = off";
  EXPECT_EQ(runtime::partition_count(whole, 2001, AllreduceAlgorithm::kAuto), 1u) << "under twice the part size";
  EXPECT_EQ(runtime::partition_count(whole, 2000, AllreduceAlgorithm::kAuto), 2u);
  EXPECT_EQ(runtime::partition_count(whole, 1000, AllreduceAlgorithm::kAuto), 4u);
  EXPECT_EQ(runtime::partition_count(whole, 999, AllreduceAlgorithm::kAuto), 5u) << "ceil(4000 / 999)";
  EXPECT_EQ(runtime::partition_count(whole, 1, AllreduceAlgorithm::kAuto), 1000u) << "at most one element a part";
  EXPECT_EQ(runtime::partition_count(whole, 1000, AllreduceAlgorithm::kAllgather), 1u) << "not the dense algorithm";
  for (const char* spec : {"fp16:nonfinite=skip", "topk:ratio=0.1", "qsgd:bits=4"}) {
    auto codec = make_compressor(spec);
    EXPECT_EQ(runtime::partition_count(prepared_for(*codec, 1000), 1000, AllreduceAlgorithm::kAuto), 1u) << spec;
  }
  const std::size_t count = runtime::partition_count(whole, 999, AllreduceAlgorithm::kAuto);
  std::size_t next = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const auto part = runtime::partition_part(whole, i, count);
    ASSERT_EQ(part.members.size(), 1u);
    const auto& member = part.members[0];
    EXPECT_EQ(member.start, next) << "part " << i;
    EXPECT_EQ(member.total, 1000u);
    EXPECT_EQ(member.step, 3u) << "the tensor's step, once";
    EXPECT_EQ(member.tensor.data(), static_cast<void*>(values.data() + next));
    EXPECT_EQ(part.group.numel, member.tensor.numel());
    EXPECT_EQ(part.record.input_bytes, member.tensor.bytes());
    EXPECT_EQ(runtime::partition_count(part, 1, AllreduceAlgorithm::kAuto), 1u) << "a part is not cut again";
    next += member.tensor.numel();
  }
  EXPECT_EQ(next, 1000u);
}

class Parts : public ::testing::TestWithParam<int> {};

TEST_P(Parts, EveryElementGetsItsUnpartitionedBitsAndErrorFeedback) {
  for (const char* spec : {"none", "fp16", "bf16", "fp16:ef=off", "none:nonfinite=pass"}) {
    SCOPED_TRACE(spec);
    run_ranks(GetParam(), [&](Communicator& comm) {
      const Outcome whole = run(comm, spec, options_with(0));
      const Outcome parted = run(comm, spec, options_with(kPartBytes));
      ASSERT_EQ(parted.bits.size(), whole.bits.size());
      for (std::size_t t = 0; t < whole.bits.size(); ++t) {
        ASSERT_EQ(parted.bits[t], whole.bits[t])
            << "tensor " << t % kSizes.size() << " at step " << t / kSizes.size() << " on rank " << comm.rank();
      }
      EXPECT_EQ(parted.residual, whole.residual) << "the error feedback differs on rank " << comm.rank();
      if (std::string(spec) == "fp16") {
        EXPECT_FALSE(whole.residual.empty()) << "fp16 keeps error feedback: the test checks nothing";
      }
      // The large tensor went in 7 parts of ~57 KB on both lanes; unpartitioned it went whole.
      EXPECT_EQ(buffers_of(whole.buffers, 400000), 1u);
      std::size_t parts = 0, part_bytes = 0;
      std::set<int> lanes;
      for (const BufferRecord& buffer : parted.buffers) {
        if (buffer.input_bytes < 50000 || buffer.input_bytes > kPartBytes || buffer.tensors != 1) continue;
        ++parts;
        part_bytes += buffer.input_bytes;
        lanes.insert(buffer.lane);
      }
      EXPECT_EQ(parts, 7u);
      EXPECT_EQ(part_bytes, 400000u);
      EXPECT_EQ(lanes, (std::set<int>{0, 1}));
      // 120 KB is under twice the part size: whole.
      EXPECT_EQ(buffers_of(parted.buffers, 120000), 1u);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Parts, ::testing::Values(2, 4));

// What must not be cut travels whole: nonfinite=skip (zeroes a whole tensor), a codec that selects across the tensor
// (top-k), one lane (nothing to overlap), partitioning off.
TEST(Whole, SkipOtherCodecsOneLaneAndOffKeepTheTensorWhole) {
  struct Case {
    const char* spec;
    RuntimeOptions options;
  };
  const Case cases[] = {{"fp16:nonfinite=skip", options_with(kPartBytes)},
                        {"topk:ratio=0.01", options_with(kPartBytes)},
                        {"qsgd:bits=4", options_with(kPartBytes)},
                        {"none", options_with(kPartBytes, 1)},
                        {"none", options_with(0)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} with {} lanes, parts of {} bytes", c.spec, c.options.pipeline_lanes,
                             c.options.partition_bytes));
    run_ranks(2, [&](Communicator& comm) {
      const Outcome outcome = run(comm, c.spec, c.options);
      EXPECT_EQ(buffers_of(outcome.buffers, 400000), 1u);
      std::size_t mid = 0;
      for (const BufferRecord& buffer : outcome.buffers) mid += buffer.input_bytes > 40000 && buffer.input_bytes < 70000;
      EXPECT_EQ(mid, 0u) << "a part travelled";
    });
  }
}

// A NaN under nonfinite=raise in one part (on every rank) fails the tensor's handle once, naming the tensor; the
// other parts are reduced, the part with the NaN is left as it was; its neighbours and the next steps run.
TEST(Errors, APartsErrorFailsItsTensorOnceAndTheRuntimeGoesOn) {
  run_ranks(2, [&](Communicator& comm) {
    Runtime rt(comm, options_with(kPartBytes));
    std::vector<float> big(100000, static_cast<float>(comm.rank() + 1)), small(500, 2.0f);
    big[71234] = std::nanf("");
    const Handle hb = rt.allreduce_async("big.weight", TensorView::of(std::span<float>(big)), "fp16");
    const Handle hs = rt.allreduce_async("small.bias", TensorView::of(std::span<float>(small)), "fp16");
    try {
      rt.wait(hb);
      ADD_FAILURE() << "a NaN under nonfinite=raise went through";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("big.weight"), std::string::npos) << e.what();
    }
    rt.wait(hs);
    EXPECT_FLOAT_EQ(small[0], 2.0f);
    EXPECT_FLOAT_EQ(big[0], 1.5f) << "part 0 has no NaN: it is reduced";
    EXPECT_FLOAT_EQ(big[71233], static_cast<float>(comm.rank() + 1)) << "the part with the NaN is left as it was";
    EXPECT_TRUE(std::isnan(big[71234]));
    const RuntimeStats stats = rt.stats();
    EXPECT_EQ(stats.tensors, 2u) << "the parted tensor completed more than once";
    for (int step = 0; step < 2; ++step) {
      std::vector<float> x(100000, static_cast<float>(comm.rank()));
      rt.wait(rt.allreduce_async("later.weight", TensorView::of(std::span<float>(x)), "none"));
      EXPECT_FLOAT_EQ(x[99999], 0.5f);
    }
  });
}

}  // namespace
}  // namespace gradcomp
