// comm/local on 1..4 ranks: the conformance suite (tests/comm/communicator_conformance.h), then what only the
// in-process backend shows: protocol mismatches, timeouts, departed ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <numeric>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "tests/comm/communicator_conformance.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;
using testing::run_ranks_collect;

class LocalRanks : public ::testing::TestWithParam<int> {};

TEST_P(LocalRanks, ConformanceAllreduce) { run_ranks(GetParam(), testing::conformance_allreduce); }
TEST_P(LocalRanks, ConformanceCollectives) { run_ranks(GetParam(), testing::conformance_collectives); }
TEST_P(LocalRanks, ConformanceAlltoall) { run_ranks(GetParam(), testing::conformance_alltoall); }
TEST_P(LocalRanks, ConformanceSplit) { run_ranks(GetParam(), testing::conformance_split); }
TEST_P(LocalRanks, ConformanceMemory) { run_ranks(GetParam(), testing::conformance_memory); }

INSTANTIATE_TEST_SUITE_P(Ranks, LocalRanks, ::testing::Values(1, 2, 3, 4));

TEST(LocalCommunicator, MissingRankTimesOutNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks_collect(
      3,
      [](Communicator& comm) {
        if (comm.rank() == 2) return;  // never joins
        comm.barrier();
      },
      std::chrono::milliseconds(300));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  ASSERT_TRUE(errors[0] && errors[1]);
  EXPECT_FALSE(errors[2]);
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Timeout& e) {
      ++timeouts;
      EXPECT_NE(std::string(e.what()).find("rank(s) 2"), std::string::npos) << e.what();
    } catch (const CommError& e) {
      // the second waiter may see the group already broken by the first
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    }
  }
  EXPECT_GE(timeouts, 1);
}

TEST(LocalCommunicator, MismatchedCollectivesFailEverywhere) {
  auto errors = run_ranks_collect(2, [](Communicator& comm) {
    std::uint32_t x = 0;
    std::vector<std::uint32_t> all(2);
    if (comm.rank() == 0) {
      comm.allgather(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(all)));
    } else {
      comm.broadcast(std::as_writable_bytes(std::span(&x, 1)), 0);
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]);
    EXPECT_THROW(std::rethrow_exception(errors[r]), CommError);
  }
}

TEST(LocalCommunicator, DestroyedRankFailsOthersFast) {
  auto comms = make_local_communicators(2, std::chrono::seconds(60));
  comms[1].reset();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(comms[0]->barrier(), CommError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  // The group stays broken.
  EXPECT_THROW(comms[0]->barrier(), CommError);
}

TEST(LocalCommunicator, TimeoutSettingsAreValidated) {
  EXPECT_THROW(make_local_communicators(0), InvalidArgument);
  auto comms = make_local_communicators(1, std::chrono::milliseconds(1234));
  EXPECT_EQ(comms[0]->timeout().count(), 1234);
  EXPECT_THROW(comms[0]->set_timeout(std::chrono::milliseconds(0)), InvalidArgument);
  EXPECT_EQ(comms[0]->backend(), "local");
  EXPECT_EQ(comms[0]->node_color(), 0);
}

}  // namespace
}  // namespace gradcomp
