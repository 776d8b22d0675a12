// comm/mpi primitives under mpirun: closed-form results of every call, f16/bf16 custom ops, split, node color.
#include <gtest/gtest.h>

#include <cstdint>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"
#include "tests/comm/mpi_world.h"

namespace gradcomp {
namespace {

using testing::mpi_world;

TEST(MpiCommunicator, IdentityAndThreadLevel) {
  Communicator& comm = mpi_world();
  EXPECT_EQ(comm.backend(), "mpi");
  EXPECT_GE(comm.size(), 2);
  EXPECT_NE(mpi_thread_level(), "none");
  EXPECT_EQ(comm.timeout().count(), 30000);
}

TEST(MpiCommunicator, AllreduceOfEveryDtypeAndOp) {
  Communicator& comm = mpi_world();
  const int n = comm.size(), r = comm.rank();
  std::vector<float> f(1000);
  for (int i = 0; i < 1000; ++i) f[i] = static_cast<float>(r * 10 + i);
  comm.allreduce(TensorView::of(std::span(f)), ReduceOp::kSum);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(f[i], static_cast<float>(10 * n * (n - 1) / 2 + n * i));
  std::vector<float> avg(3, static_cast<float>(r + 1));
  comm.allreduce(TensorView::of(std::span(avg)), ReduceOp::kAverage);
  EXPECT_FLOAT_EQ(avg[2], (n + 1) / 2.0f);
  std::int32_t mx = r * 7 - 3, mn = r * 7 - 3;
  comm.allreduce(TensorView(&mx, 1, DType::kI32), ReduceOp::kMax);
  comm.allreduce(TensorView(&mn, 1, DType::kI32), ReduceOp::kMin);
  EXPECT_EQ(mx, (n - 1) * 7 - 3);
  EXPECT_EQ(mn, -3);
  std::vector<std::uint16_t> h(777, kernels::float_to_half_bits(0.5f * (r + 1)));
  comm.allreduce(TensorView(h.data(), h.size(), DType::kF16), ReduceOp::kSum);
  for (auto bits : h) ASSERT_EQ(kernels::half_bits_to_float(bits), 0.25f * n * (n + 1));
  std::vector<std::uint16_t> b(5, kernels::float_to_bf16_bits(static_cast<float>(r)));
  comm.allreduce(TensorView(b.data(), b.size(), DType::kBF16), ReduceOp::kSum);
  EXPECT_EQ(kernels::bf16_bits_to_float(b[4]), static_cast<float>(n * (n - 1) / 2));
  std::uint8_t u = 1;
  comm.allreduce(TensorView(&u, 1, DType::kU8), ReduceOp::kSum);
  EXPECT_EQ(u, n);
  comm.allreduce(TensorView(nullptr, 0, DType::kF32), ReduceOp::kSum);
  EXPECT_THROW(comm.allreduce(TensorView(&u, 1, DType::kU8), ReduceOp::kAverage), InvalidArgument);
}

TEST(MpiCommunicator, GatherAlltoallBroadcastBarrier) {
  Communicator& comm = mpi_world();
  const int n = comm.size(), r = comm.rank();
  std::uint32_t mine = 100 + r;
  std::vector<std::uint32_t> all(n);
  comm.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[i], 100u + i);

  std::vector<std::byte> send(r + 1, std::byte(r));
  std::vector<std::size_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = i + 1;
  std::vector<std::byte> recv(n * (n + 1) / 2);
  comm.allgatherv(send, counts, recv);
  std::size_t k = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) EXPECT_EQ(recv[k++], std::byte(i));

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
}

TEST(MpiCommunicator, SplitAndNodeColor) {
  Communicator& comm = mpi_world();
  const int n = comm.size(), r = comm.rank();
  auto child = comm.split(r == 0 ? -1 : 1, -r);
  if (r == 0) {
    EXPECT_EQ(child, nullptr);
  } else {
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(child->size(), n - 1);
    EXPECT_EQ(child->rank(), n - 1 - r);
    EXPECT_EQ(child->timeout(), comm.timeout());
    std::int32_t one = 1;
    child->allreduce(TensorView(&one, 1, DType::kI32), ReduceOp::kSum);
    EXPECT_EQ(one, n - 1);
  }
  // One machine: every rank shares memory with rank 0.
  EXPECT_EQ(comm.node_color(), 0);
}

}  // namespace
}  // namespace gradcomp
