// comm/mpi under mpirun: the conformance suite (tests/comm/communicator_conformance.h; its f16/bf16 sums exercise
// the custom MPI ops), identity, thread level, node color and the owned-buffer allreduce (comm/owned_buffer_allreduce.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi/mpi_cuda_aware.h"
#include "comm/owned_buffer_allreduce.h"
#include "gradcomp/config.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "tests/comm/communicator_conformance.h"
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

TEST(MpiCommunicator, ConformanceAllreduce) { testing::conformance_allreduce(mpi_world()); }
TEST(MpiCommunicator, ConformanceCollectives) { testing::conformance_collectives(mpi_world()); }
TEST(MpiCommunicator, ConformanceAlltoall) { testing::conformance_alltoall(mpi_world()); }
TEST(MpiCommunicator, ConformanceSplit) { testing::conformance_split(mpi_world()); }
TEST(MpiCommunicator, ConformanceMemory) { testing::conformance_memory(mpi_world()); }

// CUDA memory is taken exactly when the process decided the MPI library is CUDA-aware; GRADCOMP_MPI_CUDA_AWARE=0
// keeps it host-only, =1 takes it in a CUDA build (CTest runs both, comm/mpi/mpi_cuda_aware.h).
// A broadcast goes in pieces of at most GRADCOMP_MPI_MAX_MESSAGE_BYTES (MPI counts are ints; a 5.2 GB tensor
// needs several): every rank ends with the root's bytes, also across piece boundaries and for an empty buffer.
TEST(MpiCommunicator, BroadcastInPieces) {
  Communicator& world = mpi_world();
  ASSERT_EQ(setenv("GRADCOMP_MPI_MAX_MESSAGE_BYTES", "1000", 1), 0);
  const int root = world.size() - 1;
  for (const std::size_t bytes : {std::size_t{0}, std::size_t{999}, std::size_t{1000}, std::size_t{10007}}) {
    std::vector<std::byte> buffer(bytes, std::byte{0});
    if (world.rank() == root) {
      for (std::size_t i = 0; i < bytes; ++i) buffer[i] = static_cast<std::byte>(i * 7 + 3);
    }
    world.broadcast(buffer, root);
    for (std::size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(buffer[i], static_cast<std::byte>(i * 7 + 3)) << "byte " << i << " of " << bytes;
    }
  }
  ASSERT_EQ(unsetenv("GRADCOMP_MPI_MAX_MESSAGE_BYTES"), 0);
}

// An allgatherv of more than GRADCOMP_MPI_MAX_MESSAGE_BYTES in all (MPI's int counts end at 2 GiB; 64 ranks' top-k
// payloads of a 1.3B-value model are 6.7 GB) goes in rounds: every rank ends with every rank's bytes in rank order,
// for uneven counts, an empty rank, and blocks longer than one round's share.
TEST(MpiCommunicator, AllgathervInRounds) {
  Communicator& world = mpi_world();
  ASSERT_EQ(setenv("GRADCOMP_MPI_MAX_MESSAGE_BYTES", "1000", 1), 0);
  const int n = world.size();
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    counts[static_cast<std::size_t>(r)] = r == 1 ? 0 : 1700 + 1311 * static_cast<std::size_t>(r);
  }
  auto byte_of = [](int r, std::size_t i) { return static_cast<std::byte>((r * 31 + i * 7) & 0xff); };
  std::vector<std::byte> mine(counts[static_cast<std::size_t>(world.rank())]);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = byte_of(world.rank(), i);
  std::size_t total = 0;
  for (const std::size_t c : counts) total += c;
  std::vector<std::byte> all(total, std::byte{0});
  world.allgatherv(mine, counts, all);
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i, ++at) {
      ASSERT_EQ(all[at], byte_of(r, i)) << "rank " << r << " byte " << i;
    }
  }
  ASSERT_EQ(unsetenv("GRADCOMP_MPI_MAX_MESSAGE_BYTES"), 0);
}

TEST(MpiCommunicator, TakesCudaMemoryOnlyWhenCudaAware) {
  Communicator& comm = mpi_world();
  EXPECT_TRUE(comm.takes(Device::cpu()));
  EXPECT_EQ(comm.takes(Device::cuda(0)), mpi::cuda_aware());
  const std::string forced = std::getenv("GRADCOMP_MPI_CUDA_AWARE") ? std::getenv("GRADCOMP_MPI_CUDA_AWARE") : "";
  if (forced == "0") {
    EXPECT_FALSE(comm.takes(Device::cuda(0)));
  } else if (forced == "1") {
    EXPECT_EQ(comm.takes(Device::cuda(0)), GRADCOMP_WITH_CUDA != 0);
  }
  std::unique_ptr<Communicator> child = comm.split(0, comm.rank());
  EXPECT_EQ(child->takes(Device::cuda(0)), comm.takes(Device::cuda(0)));
}

TEST(MpiCommunicator, NodeColor) {
  Communicator& comm = mpi_world();
  // One machine: every rank shares memory with rank 0.
  EXPECT_EQ(comm.node_color(), 0);
}

// A payload-like buffer: 8 header bytes (rank-specific: they must come back as this rank wrote them), `count` f32
// values r + i, 4 trailing bytes; the result holds the sum over ranks and this rank's header and trailer.
TEST(MpiCommunicator, OwnedBufferAllreduceSumsOnlyTheBody) {
  Communicator& comm = mpi_world();
  auto* staged = dynamic_cast<OwnedBufferAllreduce*>(&comm);
  ASSERT_NE(staged, nullptr) << "the MPI communicator must offer the owned-buffer allreduce (dense uses it)";
  const int n = comm.size(), r = comm.rank();
  for (const std::size_t count : {std::size_t{0}, std::size_t{5}, std::size_t{100000}}) {
    const std::size_t bytes = 8 + count * sizeof(float) + 4;
    std::vector<std::byte> seen;
    staged->allreduce_in_owned_buffer(
        bytes + 16,
        [&](std::span<std::byte> send) {
          EXPECT_GE(send.size(), bytes);
          std::memset(send.data(), 0x40 + r, 8);
          for (std::size_t i = 0; i < count; ++i) {
            const float v = static_cast<float>(r) + static_cast<float>(i);
            std::memcpy(send.data() + 8 + i * sizeof(float), &v, sizeof v);
          }
          std::memset(send.data() + 8 + count * sizeof(float), 0x70 + r, 4);
          return OwnedBufferAllreduce::Filled{bytes, 8, count, DType::kF32};
        },
        [&](std::span<const std::byte> result) { seen.assign(result.begin(), result.end()); });
    ASSERT_EQ(seen.size(), bytes);
    for (int k = 0; k < 8; ++k) EXPECT_EQ(seen[k], std::byte(0x40 + r));
    for (int k = 0; k < 4; ++k) EXPECT_EQ(seen[bytes - 4 + k], std::byte(0x70 + r));
    const float rank_sum = static_cast<float>(n * (n - 1) / 2);
    for (std::size_t i = 0; i < count; ++i) {
      float v = 0;
      std::memcpy(&v, seen.data() + 8 + i * sizeof(float), sizeof v);
      ASSERT_EQ(v, rank_sum + static_cast<float>(n) * static_cast<float>(i)) << "element " << i;
    }
  }
}

TEST(MpiCommunicator, OwnedBufferAllreduceHalfBodyAndErrors) {
  Communicator& comm = mpi_world();
  auto& staged = dynamic_cast<OwnedBufferAllreduce&>(comm);
  const int n = comm.size();
  // f16 body (the custom MPI op): every rank sends 1.5 at offset 2.
  std::vector<std::uint16_t> out;
  staged.allreduce_in_owned_buffer(
      2 + 64 * 2,
      [&](std::span<std::byte> send) {
        const std::uint16_t one_and_half = 0x3E00;
        for (int i = 0; i < 64; ++i) std::memcpy(send.data() + 2 + 2 * i, &one_and_half, 2);
        return OwnedBufferAllreduce::Filled{2 + 64 * 2, 2, 64, DType::kF16};
      },
      [&](std::span<const std::byte> result) {
        out.resize(64);
        std::memcpy(out.data(), result.data() + 2, 64 * 2);
      });
  // 1.5 n in IEEE half for the world sizes the tests run at: 3.0, 4.5, 6.0.
  ASSERT_TRUE(n >= 2 && n <= 4) << n;
  const std::uint16_t expect[] = {0x4200, 0x4480, 0x4600};
  ASSERT_EQ(out.size(), 64u);
  for (const std::uint16_t v : out) ASSERT_EQ(v, expect[n - 2]);
  // A body outside the bytes written: InvalidArgument on every rank, before anything is sent.
  EXPECT_THROW(staged.allreduce_in_owned_buffer(
                   64, [](std::span<std::byte>) { return OwnedBufferAllreduce::Filled{16, 8, 4, DType::kF32}; },
                   [](std::span<const std::byte>) { FAIL() << "drained after a refused fill"; }),
               InvalidArgument);
  // A fill that throws (a codec refusing NaN) propagates; the communicator stays usable.
  EXPECT_THROW(staged.allreduce_in_owned_buffer(
                   64, [](std::span<std::byte>) -> OwnedBufferAllreduce::Filled { throw std::runtime_error("codec"); },
                   [](std::span<const std::byte>) {}),
               std::runtime_error);
  std::vector<float> one{1.0f};
  comm.allreduce(TensorView(one.data(), 1, DType::kF32), ReduceOp::kSum);
  EXPECT_EQ(one[0], static_cast<float>(n));
}

}  // namespace
}  // namespace gradcomp
