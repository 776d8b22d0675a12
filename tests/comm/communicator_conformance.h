// One conformance suite for every Communicator backend (as Gloo runs one test body over every transport): closed-form
// results of each primitive on any rank count, for the rank calling it. tests/comm/local_communicator_test.cc runs it
// on 1..4 in-process ranks, tests/comm/mpi_communicator_test.cc under mpirun (2 and 4 ranks).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"

namespace gradcomp::testing {

// allreduce of f32 (sum, average), i32 (max, min), f16 and bf16 (sum, average), u8 (sum), empty tensors, and the
// refusal of an integer average.
inline void conformance_allreduce(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  std::vector<float> f(1000);
  for (int i = 0; i < 1000; ++i) f[i] = static_cast<float>(r * 10 + i);
  comm.allreduce(TensorView::of(std::span(f)), ReduceOp::kSum);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(f[i], static_cast<float>(10 * n * (n - 1) / 2 + n * i)) << i;

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
  std::uint16_t two = kernels::float_to_bf16_bits(2.0f);
  comm.allreduce(TensorView(&two, 1, DType::kBF16), ReduceOp::kAverage);
  EXPECT_EQ(kernels::bf16_bits_to_float(two), 2.0f);

  std::uint8_t u = 1;
  comm.allreduce(TensorView(&u, 1, DType::kU8), ReduceOp::kSum);
  EXPECT_EQ(u, n);
  comm.allreduce(TensorView(nullptr, 0, DType::kF32), ReduceOp::kSum);
  EXPECT_THROW(comm.allreduce(TensorView(&mx, 1, DType::kI32), ReduceOp::kAverage), InvalidArgument);
}

// allgather, allgatherv (rank i sends i+1 bytes), alltoallv (rank s sends d+1 bytes of 16s+d to d), broadcast from
// the last rank, barrier.
inline void conformance_collectives(Communicator& comm) {
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

// alltoall (rank s sends the u32 100s+d to d); a buffer that is not size() equal blocks throws InvalidArgument on
// every rank before anything is sent; then Adasum's pairwise exchange as an alltoallv: ranks 2p and 2p+1 swap 8p
// bytes, so the first pair's (and an odd count's last rank's) counts are all zero, locally one count for every pair,
// while the other ranks' differ: the call must still be the same collective on every rank.
inline void conformance_alltoall(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  std::vector<std::uint32_t> out(n), in(n, 0);
  for (int d = 0; d < n; ++d) out[d] = 100 * r + d;
  comm.alltoall(std::as_bytes(std::span(out)), std::as_writable_bytes(std::span(in)));
  for (int s = 0; s < n; ++s) EXPECT_EQ(in[s], static_cast<std::uint32_t>(100 * s + r)) << "from rank " << s;
  std::vector<std::byte> short_send(4 * n), long_recv(4 * n + 4);
  EXPECT_THROW(comm.alltoall(short_send, long_recv), InvalidArgument);

  const int peer = (r ^ 1) < n ? r ^ 1 : r;
  const std::size_t bytes = peer == r ? 0 : 8 * static_cast<std::size_t>(r / 2);
  std::vector<std::size_t> counts(n, 0);
  counts[peer] = bytes;
  std::vector<std::byte> send(bytes, std::byte(r)), recv(bytes, std::byte(0xff));
  comm.alltoallv(send, counts, recv, counts);
  for (std::size_t i = 0; i < bytes; ++i) EXPECT_EQ(recv[i], std::byte(peer)) << "byte " << i;
  comm.barrier();
}

// split into even/odd ranks ordered by descending rank, rank 0 opting out when there are more than two ranks; the
// child keeps the parent's timeout and works.
inline void conformance_split(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  const int color = (n > 2 && r == 0) ? -1 : r % 2;
  auto child = comm.split(color, -r);
  if (color < 0) {
    EXPECT_EQ(child, nullptr);
    return;
  }
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
  EXPECT_EQ(child->timeout(), comm.timeout());
  std::int32_t one = 1;
  child->allreduce(TensorView(&one, 1, DType::kI32), ReduceOp::kSum);
  EXPECT_EQ(one, members);
}

// Memory the communicator does not take (CUDA memory, on a backend that takes host memory only): every call refuses it
// with InvalidArgument naming the backend, on every rank, before it communicates; the communicator stays usable.
inline void conformance_memory(Communicator& comm) {
  const Device device = Device::cuda(0);
  if (comm.takes(device)) GTEST_SKIP() << comm.backend() << " takes " << device_name(device);
  const int n = comm.size();
  std::vector<std::byte> send(4), recv(4 * static_cast<std::size_t>(n));
  const std::vector<std::size_t> counts(static_cast<std::size_t>(n), 4);
  const Memory memory = Memory::on(device, nullptr);  // labelled device memory: never read
  try {
    comm.allgather(send, recv, memory);
    ADD_FAILURE() << "allgather took memory on " << device_name(device);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(comm.backend()), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm.allgatherv(send, counts, recv, memory), InvalidArgument);
  EXPECT_THROW(comm.alltoallv(recv, counts, recv, counts, memory), InvalidArgument);
  EXPECT_THROW(comm.broadcast(send, 0, memory), InvalidArgument);
  float value = 1;
  EXPECT_THROW(comm.allreduce(TensorView(&value, 1, DType::kF32, device), ReduceOp::kSum), InvalidArgument);
  comm.allreduce(TensorView(&value, 1, DType::kF32), ReduceOp::kSum);
  EXPECT_EQ(value, static_cast<float>(n));
}

}  // namespace gradcomp::testing
