// Runtime::save_state / load_state on comm/local (ranks as threads): a fresh runtime that loads every rank's state
// continues bit for bit like the runtime that saved it (topk, qsgd through scatter-reduce-allgather, dgc with
// momentum and warm-up, several tensors per fusion buffer); not loading changes the bits; bad states are rejected.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

constexpr int kRanks = 4;

// Three groups of tensors, one spec each; each group fuses into one buffer per step.
const std::vector<std::size_t> kSizes = {3000, 517, 1200, 2048, 33, 4100, 700, 1500, 999};

RuntimeOptions state_options() {
  RuntimeOptions options;
  options.fusion_threshold_bytes = std::size_t{1} << 20;
  options.timeline_path = "";
  // A long cycle: a step's tensors, enqueued back to back, are nearly always announced in one cycle, so both runs
  // group them alike (the schedules are compared below, and a run with different grouping is repeated).
  options.cycle_time_ms = 20;
  options.policy.rules = {{"topk.*", "topk:ratio=0.05"},
                          {"qsgd.*", "qsgd:bits=4"},
                          {"dgc.*", "dgc:ratio=0.02,momentum=0.9,warmup_steps=2"}};
  options.policy.default_spec = "none";
  return options;
}

std::string tensor_name(std::size_t t) {
  static const char* kinds[] = {"topk", "qsgd", "dgc"};
  return fmt::format("{}.w{}", kinds[t % 3], t);
}

// Gradients of one step: a function of (rank, step, tensor) only.
void fill(std::vector<std::vector<float>>& data, int rank, int step) {
  data.resize(kSizes.size());
  for (std::size_t t = 0; t < kSizes.size(); ++t) {
    std::mt19937 rng(static_cast<std::uint32_t>(1000003 * rank + 1009 * step + t));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    data[t].resize(kSizes[t]);
    for (float& v : data[t]) v = normal(rng);
  }
}

// Runs steps [first, last) and appends every tensor's result bits and the executed buffers to `bits`/`schedule`.
void run_steps(Runtime& rt, int rank, int first, int last, std::vector<std::uint32_t>& bits,
               std::vector<std::string>& schedule) {
  std::vector<std::vector<float>> data;
  rt.take_stats();
  for (int step = first; step < last; ++step) {
    fill(data, rank, step);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      rt.allreduce_async(tensor_name(t), TensorView::of(std::span<float>(data[t])));
    }
    rt.synchronize();
    for (const auto& tensor : data) {
      for (float v : tensor) bits.push_back(std::bit_cast<std::uint32_t>(v));
    }
  }
  for (const BufferRecord& record : rt.take_stats().buffers) {
    schedule.push_back(fmt::format("{} {} {} {}", record.spec, record.algorithm, record.tensors, record.input_bytes));
  }
}

TEST(RuntimeState, ResumeIsBitIdenticalAndNotLoadingDiffers) {
  bool compared = false;
  // Grouping follows arrival within cycles; on a loaded machine a step's tensors may straddle a cycle boundary, and
  // then the two runs group differently (legitimately different bits). Such attempts are repeated.
  for (int attempt = 0; attempt < 5 && !compared; ++attempt) {
    std::vector<int> same_schedule(kRanks, 0);
    run_ranks(
        kRanks,
        [&](Communicator& comm) {
          const int rank = comm.rank();
          std::vector<std::uint32_t> warm_bits, uninterrupted, resumed, fresh;
          std::vector<std::string> warm_schedule, schedule_a, schedule_b, schedule_c;
          std::vector<std::byte> state;
          std::vector<std::vector<float>> residuals_a(kSizes.size()), residuals_b(kSizes.size());
          {
            Runtime a(comm, state_options());
            run_steps(a, rank, 0, 3, warm_bits, warm_schedule);
            state = a.save_state();
            EXPECT_EQ(a.save_state(), state) << "saving twice gives the same bytes";
            run_steps(a, rank, 3, 5, uninterrupted, schedule_a);
            for (std::size_t t = 0; t < kSizes.size(); ++t) residuals_a[t] = a.residual(tensor_name(t));
            a.shutdown();
          }
          {
            Runtime b(comm, state_options());
            b.load_state(state);
            EXPECT_EQ(b.save_state(), state) << "a loaded state saves back to the same bytes";
            run_steps(b, rank, 3, 5, resumed, schedule_b);
            for (std::size_t t = 0; t < kSizes.size(); ++t) residuals_b[t] = b.residual(tensor_name(t));
            b.shutdown();
          }
          {
            Runtime c(comm, state_options());
            run_steps(c, rank, 3, 5, fresh, schedule_c);
            c.shutdown();
          }
          if (schedule_a != schedule_b || schedule_a != schedule_c) return;  // grouped differently: try again
          same_schedule[rank] = 1;
          ASSERT_EQ(uninterrupted.size(), resumed.size());
          std::size_t differ = 0;
          for (std::size_t i = 0; i < uninterrupted.size(); ++i) differ += uninterrupted[i] != resumed[i];
          EXPECT_EQ(differ, 0u) << "rank " << rank << ": resumed results differ from the uninterrupted run";
          for (std::size_t t = 0; t < kSizes.size(); ++t) {
            // Every codec keeps its residual (dgc: its accumulator) under the tensor's own name.
            EXPECT_EQ(residuals_a[t].size(), kSizes[t]) << tensor_name(t);
            EXPECT_EQ(residuals_a[t], residuals_b[t])
                << "rank " << rank << " residual of " << tensor_name(t);
          }
          // Without the state the next steps differ: the test can fail.
          std::size_t differ_fresh = 0;
          for (std::size_t i = 0; i < uninterrupted.size(); ++i) differ_fresh += uninterrupted[i] != fresh[i];
          EXPECT_GT(differ_fresh, uninterrupted.size() / 100) << "rank " << rank;
          // Per buffer of the schedule: sra for qsgd (its second codec instance was part of the state).
          bool saw_sra = false;
          for (const auto& line : schedule_a) saw_sra = saw_sra || line.find(" sra ") != std::string::npos;
          EXPECT_TRUE(saw_sra) << fmt::format("{}", fmt::join(schedule_a, "; "));
        },
        std::chrono::seconds(60));
    int agreed = 0;
    for (int s : same_schedule) agreed += s;
    ASSERT_TRUE(agreed == 0 || agreed == kRanks) << "ranks saw different schedules";
    compared = agreed == kRanks;
  }
  EXPECT_TRUE(compared) << "five attempts grouped the tensors differently; nothing was compared";
}

TEST(RuntimeState, RejectsCorruptForeignAndMismatchedStates) {
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    std::vector<std::byte> mine, other;
    {
      Runtime a(comm, state_options());
      std::vector<std::uint32_t> bits;
      std::vector<std::string> schedule;
      run_steps(a, rank, 0, 2, bits, schedule);
      mine = a.save_state();
      a.shutdown();
    }
    // Exchange states so every rank holds its peer's too.
    std::vector<std::uint64_t> sizes(2);
    const std::uint64_t my_size = mine.size();
    comm.allgather(std::as_bytes(std::span<const std::uint64_t>(&my_size, 1)),
                   std::as_writable_bytes(std::span<std::uint64_t>(sizes)));
    std::vector<std::byte> all(sizes[0] + sizes[1]);
    const std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    comm.allgatherv(mine, counts, all);
    const std::size_t peer_offset = rank == 0 ? sizes[0] : 0;
    other.assign(all.begin() + static_cast<std::ptrdiff_t>(peer_offset),
                 all.begin() + static_cast<std::ptrdiff_t>(peer_offset + sizes[1 - rank]));

    Runtime b(comm, state_options());
    const std::vector<std::byte> empty_state = b.save_state();
    // Damaged bytes: a flipped byte in the body, a truncation, garbage.
    std::vector<std::byte> flipped = mine;
    flipped[flipped.size() / 2] ^= std::byte{0x40};
    EXPECT_THROW(b.load_state(flipped), CorruptPayload);
    EXPECT_THROW(b.load_state(std::span<const std::byte>(mine).first(mine.size() - 3)), CorruptPayload);
    EXPECT_THROW(b.load_state(std::span<const std::byte>(mine).first(10)), CorruptPayload);
    std::vector<std::byte> garbage(64, std::byte{0x5a});
    EXPECT_THROW(b.load_state(garbage), CorruptPayload);
    // The peer's state: InvalidArgument naming both ranks.
    try {
      b.load_state(other);
      ADD_FAILURE() << "loading rank " << 1 - rank << "'s state on rank " << rank << " did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("saved by rank {} of 2", 1 - rank)), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(b.save_state(), empty_state) << "failed loads left the runtime unchanged";

    // The own state loads; a tensor of another size or spec under a loaded name is refused, naming it.
    b.load_state(mine);
    std::vector<float> wrong_size(kSizes[0] + 1, 1.0f);
    try {
      b.allreduce_async(tensor_name(0), TensorView::of(std::span<float>(wrong_size)));
      ADD_FAILURE() << "a tensor of another size was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'topk.w0'"), std::string::npos) << e.what();
    }
    std::vector<float> right_size(kSizes[1], 1.0f);
    try {
      b.allreduce_async(tensor_name(1), TensorView::of(std::span<float>(right_size)), "topk:ratio=0.05");
      ADD_FAILURE() << "a tensor with another spec was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'qsgd.w1'"), std::string::npos) << e.what();
    }

    // Pending work: rank 0 submits a name rank 1 never does, so it stays pending; save and load refuse.
    if (rank == 0) {
      std::vector<float> lonely(10, 1.0f);
      b.allreduce_async("only.rank0", TensorView::of(std::span<float>(lonely)));
      EXPECT_THROW(b.save_state(), InvalidArgument);
      EXPECT_THROW(b.load_state(mine), InvalidArgument);
    }
    b.shutdown();  // completes the lonely tensor with an error
  });
}

TEST(RuntimeState, StateOfAnotherWorldSizeIsRefused) {
  std::vector<std::byte> state;
  run_ranks(1, [&](Communicator& comm) {
    Runtime rt(comm, state_options());
    std::vector<std::uint32_t> bits;
    std::vector<std::string> schedule;
    run_steps(rt, 0, 0, 1, bits, schedule);
    state = rt.save_state();
  });
  run_ranks(2, [&](Communicator& comm) {
    Runtime rt(comm, state_options());
    if (comm.rank() == 0) {
      try {
        rt.load_state(state);
        ADD_FAILURE() << "a state of a 1-rank runtime loaded into a 2-rank one";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("of 1"), std::string::npos) << e.what();
      }
    }
  });
}

// A state in the runtime's own envelope of version 2 (before the one state envelope) still loads, and loads the same
// as its version-3 bytes: magic | 2 | checksum of the body | u64 length + body (u32 world | u32 rank | executor).
TEST(RuntimeState, Version2StatesStillLoad) {
  run_ranks(1, [&](Communicator& comm) {
    Runtime a(comm, state_options());
    std::vector<std::uint32_t> bits;
    std::vector<std::string> schedule;
    run_steps(a, 0, 0, 2, bits, schedule);
    const std::vector<std::byte> current = a.save_state();
    a.shutdown();
    const StateEnvelope envelope = open_state(current, "test");
    EXPECT_EQ(envelope.kind, "runtime");
    std::vector<std::byte> body(8);
    const std::uint32_t world_rank[2] = {1, 0};
    std::memcpy(body.data(), world_rank, 8);
    body.insert(body.end(), envelope.state.begin(), envelope.state.end());
    std::vector<std::byte> legacy(24);
    const std::uint32_t head[2] = {0x53524347, 2};
    const std::uint64_t sum = state_checksum(body);
    const std::uint64_t length = body.size();
    std::memcpy(legacy.data(), head, 8);
    std::memcpy(legacy.data() + 8, &sum, 8);
    std::memcpy(legacy.data() + 16, &length, 8);
    legacy.insert(legacy.end(), body.begin(), body.end());
    Runtime b(comm, state_options());
    b.load_state(legacy);
    EXPECT_EQ(b.save_state(), current);
    legacy.back() ^= std::byte{1};
    EXPECT_THROW(b.load_state(legacy), CorruptPayload);
  });
}

}  // namespace
}  // namespace gradcomp
