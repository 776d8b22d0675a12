// comm/mpi's own pipelined ring allreduce (comm/mpi/mpi_ring.h) under mpirun at 2, 3 and 4 ranks: the communicator is
// made with GRADCOMP_MPI_RING_MIN_BYTES=0, so every allreduce here takes the ring, from one element to several
// segments per block, with blocks that do not divide evenly and blocks that are empty. Each rank rebuilds every
// rank's input, so the expected sums are computed here, independently of MPI; results must be bitwise identical on
// every rank (one rank reduces each block, the others receive it).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "comm/owned_buffer_allreduce.h"
#include "gradcomp/communicator.h"
#include "kernels/half_ops.cuh"
#include "tests/comm/communicator_conformance.h"

namespace gradcomp {
namespace {

Communicator& ring_world() {
  static std::unique_ptr<Communicator> world = [] {
    setenv("GRADCOMP_MPI_RING_MIN_BYTES", "0", 1);
    MpiOptions options;
    options.timeout = std::chrono::seconds(30);
    auto comm = make_mpi_world_communicator(options);
    unsetenv("GRADCOMP_MPI_RING_MIN_BYTES");
    return comm;
  }();
  return *world;
}

// Rank r's input: small integers (exact in f32 at any summation order) or random floats.
std::vector<float> input(int r, std::size_t count, bool integers) {
  std::mt19937 rng(static_cast<unsigned>(7919 * r + count));
  std::uniform_int_distribution<int> small(-1000, 1000);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = integers ? static_cast<float>(small(rng)) : normal(rng);
  return v;
}

// Every rank must hold exactly these bytes: each gathers everyone's result and compares with its own.
void expect_same_on_every_rank(Communicator& comm, std::span<const std::byte> mine) {
  std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine, all);
  for (int q = 0; q < comm.size(); ++q) {
    ASSERT_EQ(std::memcmp(all.data() + q * mine.size(), mine.data(), mine.size()), 0)
        << "rank " << comm.rank() << " and rank " << q << " hold different results";
  }
}

// Sizes: one element per rank and fewer elements than 2 x ranks (empty and one-element blocks), odd sizes, one
// 1 MiB segment exactly, and several segments per block with a short last segment.
const std::size_t kCounts[] = {4, 5, 7, 1000, 262144, 3 * 262144 + 17, 4 * 262144 * 3 + 5};

TEST(MpiRing, SumsExactlyAtEverySize) {
  Communicator& comm = ring_world();
  const int n = comm.size();
  for (const std::size_t count : kCounts) {
    if (count < static_cast<std::size_t>(n)) continue;
    std::vector<float> got = input(comm.rank(), count, /*integers=*/true);
    comm.allreduce(TensorView::of(std::span(got)), ReduceOp::kSum);
    std::vector<float> want(count, 0.0f);
    for (int q = 0; q < n; ++q) {
      const std::vector<float> theirs = input(q, count, true);
      for (std::size_t i = 0; i < count; ++i) want[i] += theirs[i];
    }
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], want[i]) << "count " << count << " element " << i;
  }
}

TEST(MpiRing, FloatSumsAgreeBitwiseAcrossRanks) {
  Communicator& comm = ring_world();
  const int n = comm.size();
  for (const std::size_t count : kCounts) {
    std::vector<float> got = input(comm.rank(), count, /*integers=*/false);
    comm.allreduce(TensorView::of(std::span(got)), ReduceOp::kAverage);
    expect_same_on_every_rank(comm, std::as_bytes(std::span(got)));
    std::vector<double> want(count, 0.0);
    for (int q = 0; q < n; ++q) {
      const std::vector<float> theirs = input(q, count, false);
      for (std::size_t i = 0; i < count; ++i) want[i] += theirs[i];
    }
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_NEAR(got[i], want[i] / n, 1e-5) << "count " << count << " element " << i;
    }
  }
}

TEST(MpiRing, OtherTypesAndOps) {
  Communicator& comm = ring_world();
  const int n = comm.size(), r = comm.rank();
  const std::size_t count = 3 * 262144 + 17;
  std::vector<std::int32_t> d(count);
  std::vector<std::int32_t> mx(count), mn(count);
  for (std::size_t i = 0; i < count; ++i) {
    d[i] = 3 * r + static_cast<std::int32_t>(i);
    mx[i] = mn[i] = static_cast<std::int32_t>((r * 7919 + i * 31) % 1001) - 500;
  }
  comm.allreduce(TensorView(d.data(), count, DType::kI32), ReduceOp::kSum);
  comm.allreduce(TensorView(mx.data(), count, DType::kI32), ReduceOp::kMax);
  comm.allreduce(TensorView(mn.data(), count, DType::kI32), ReduceOp::kMin);
  for (std::size_t i = 0; i < count; ++i) {
    std::int32_t hi = -1000, lo = 1000;
    for (int q = 0; q < n; ++q) {
      const std::int32_t v = static_cast<std::int32_t>((q * 7919 + i * 31) % 1001) - 500;
      hi = std::max(hi, v);
      lo = std::min(lo, v);
    }
    ASSERT_EQ(d[i], 3 * n * (n - 1) / 2 + n * static_cast<std::int32_t>(i)) << i;
    ASSERT_EQ(mx[i], hi) << i;
    ASSERT_EQ(mn[i], lo) << i;
  }
  // f16 and bf16 go through the communicator's own MPI op, reduced locally by MPI_Reduce_local.
  std::vector<std::uint16_t> h(2 * 524288 + 3, kernels::float_to_half_bits(0.5f * static_cast<float>(r + 1)));
  comm.allreduce(TensorView(h.data(), h.size(), DType::kF16), ReduceOp::kSum);
  for (const std::uint16_t bits : h) ASSERT_EQ(kernels::half_bits_to_float(bits), 0.25f * n * (n + 1));
  std::vector<std::uint16_t> b(524288 + 1, kernels::float_to_bf16_bits(static_cast<float>(r)));
  comm.allreduce(TensorView(b.data(), b.size(), DType::kBF16), ReduceOp::kSum);
  for (const std::uint16_t bits : b) ASSERT_EQ(kernels::bf16_bits_to_float(bits), static_cast<float>(n * (n - 1) / 2));
}

// The owned-buffer allreduce reduces its body in place in the communicator's send buffer: the header and trailer come back
// as this rank wrote them.
TEST(MpiRing, StagedBodyInPlace) {
  Communicator& comm = ring_world();
  auto& staged = dynamic_cast<OwnedBufferAllreduce&>(comm);
  const int n = comm.size(), r = comm.rank();
  const std::size_t count = 2 * 262144 + 9, bytes = 12 + count * sizeof(float) + 3;
  std::vector<std::byte> seen;
  staged.allreduce_in_owned_buffer(
      bytes,
      [&](std::span<std::byte> send) {
        std::memset(send.data(), 0x20 + r, 12);
        for (std::size_t i = 0; i < count; ++i) {
          const float v = static_cast<float>(r) - static_cast<float>(i % 100);
          std::memcpy(send.data() + 12 + i * sizeof(float), &v, sizeof v);
        }
        std::memset(send.data() + 12 + count * sizeof(float), 0x60 + r, 3);
        return OwnedBufferAllreduce::Filled{bytes, 12, count, DType::kF32};
      },
      [&](std::span<const std::byte> result) { seen.assign(result.begin(), result.end()); });
  ASSERT_EQ(seen.size(), bytes);
  for (int k = 0; k < 12; ++k) ASSERT_EQ(seen[k], std::byte(0x20 + r));
  for (int k = 0; k < 3; ++k) ASSERT_EQ(seen[bytes - 3 + k], std::byte(0x60 + r));
  for (std::size_t i = 0; i < count; ++i) {
    float v = 0;
    std::memcpy(&v, seen.data() + 12 + i * sizeof(float), sizeof v);
    ASSERT_EQ(v, static_cast<float>(n * (n - 1) / 2) - static_cast<float>(n) * static_cast<float>(i % 100)) << i;
  }
}

// Everything the conformance suite checks, through the ring (sizes down to one element: those fall back to MPI's
// allreduce when the array has fewer elements than ranks).
TEST(MpiRing, Conformance) { testing::conformance_allreduce(ring_world()); }

}  // namespace
}  // namespace gradcomp
