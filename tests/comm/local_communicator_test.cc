// comm/local primitives on 1..4 ranks: closed-form results, protocol mismatches, timeouts, departed ranks, split.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <numeric>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;
using testing::run_ranks_collect;

class LocalRanks : public ::testing::TestWithParam<int> {};

TEST_P(LocalRanks, AllreduceSumAverageMaxOfEveryDtype) {
  const int n = GetParam();
  run_ranks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> f(5);
    for (int i = 0; i < 5; ++i) f[i] = static_cast<float>(r * 10 + i);
    comm.allreduce(TensorView::of(std::span(f)), ReduceOp::kSum);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(f[i], static_cast<float>(10 * n * (n - 1) / 2 + n * i));

    std::vector<float> avg(3, static_cast<float>(r + 1));
    comm.allreduce(TensorView::of(std::span(avg)), ReduceOp::kAverage);
    EXPECT_FLOAT_EQ(avg[0], (n + 1) / 2.0f);

    std::int32_t mx = r * 7 - 3;
    comm.allreduce(TensorView(&mx, 1, DType::kI32), ReduceOp::kMax);
    EXPECT_EQ(mx, (n - 1) * 7 - 3);
    std::int32_t mn = r * 7 - 3;
    comm.allreduce(TensorView(&mn, 1, DType::kI32), ReduceOp::kMin);
    EXPECT_EQ(mn, -3);

    std::uint16_t h = kernels::float_to_half_bits(0.5f * (r + 1));
    comm.allreduce(TensorView(&h, 1, DType::kF16), ReduceOp::kSum);
    EXPECT_EQ(kernels::half_bits_to_float(h), 0.25f * n * (n + 1));
    std::uint16_t b = kernels::float_to_bf16_bits(2.0f);
    comm.allreduce(TensorView(&b, 1, DType::kBF16), ReduceOp::kAverage);
    EXPECT_EQ(kernels::bf16_bits_to_float(b), 2.0f);

    std::vector<float> empty;
    comm.allreduce(TensorView(nullptr, 0, DType::kF32), ReduceOp::kSum);
    EXPECT_THROW(comm.allreduce(TensorView(&mx, 1, DType::kI32), ReduceOp::kAverage), InvalidArgument);
  });
}

TEST_P(LocalRanks, GatherScatterBroadcastSplit) {
  const int n = GetParam();
  run_ranks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    std::uint32_t mine = 100 + r;
    std::vector<std::uint32_t> all(n);
    comm.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
    for (int i = 0; i < n; ++i) EXPECT_EQ(all[i], 100u + i);

    // allgatherv: rank i sends i+1 bytes of value i.
    std::vector<std::byte> send(r + 1, std::byte(r));
    std::vector<std::size_t> counts(n);
    for (int i = 0; i < n; ++i) counts[i] = i + 1;
    std::vector<std::byte> recv(n * (n + 1) / 2);
    comm.allgatherv(send, counts, recv);
    std::size_t k = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) EXPECT_EQ(recv[k++], std::byte(i));

    // alltoallv: rank s sends (d+1) bytes of value 16*s+d to d.
    std::vector<std::byte> out;
    std::vector<std::size_t> scounts(n), rcounts(n);
    for (int d = 0; d < n; ++d) {
      scounts[d] = d + 1;
      out.insert(out.end(), d + 1, std::byte(16 * r + d));
      rcounts[d] = r + 1;
    }
    std::vector<std::byte> in(n * (r + 1));
    comm.alltoallv(out, scounts, in, rcounts);
    for (int s = 0; s < n; ++s)
      for (int j = 0; j <= r; ++j) EXPECT_EQ(in[s * (r + 1) + j], std::byte(16 * s + r));

    std::uint64_t value = r == n - 1 ? 42 : 0;
    comm.broadcast(std::as_writable_bytes(std::span(&value, 1)), n - 1);
    EXPECT_EQ(value, 42u);
    comm.barrier();

    // split into even/odd, ordered by descending rank; rank 0 opts out when n > 2.
    const int color = (n > 2 && r == 0) ? -1 : r % 2;
    auto child = comm.split(color, -r);
    if (color < 0) {
      EXPECT_EQ(child, nullptr);
    } else {
      ASSERT_NE(child, nullptr);
      int members = 0, position = 0;
      for (int i = 0; i < n; ++i) {
        if (!(n > 2 && i == 0) && i % 2 == color) {
          ++members;
          if (i > r) ++position;
        }
      }
      EXPECT_EQ(child->size(), members);
      EXPECT_EQ(child->rank(), position);
      std::int32_t one = 1;
      child->allreduce(TensorView(&one, 1, DType::kI32), ReduceOp::kSum);
      EXPECT_EQ(one, members);
    }
  });
}

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
