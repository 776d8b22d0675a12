// The MPI Mailbox (include/gradcomp/mailbox.h) under mpirun: notes from each sender arrive in order, receive() gives
// up after its wait, bad notes are refused before anything is sent, and a closed mailbox receives nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/mailbox.h"
#include "tests/comm/mpi_world.h"

namespace gradcomp {
namespace {

Mailbox& mailbox() {
  static std::unique_ptr<Mailbox> box = [] {
    testing::mpi_world();  // MPI initialized and the world communicator made first, in the same order on every rank
    return make_mpi_world_mailbox(std::chrono::seconds(30));
  }();
  return *box;
}

std::vector<std::byte> note_of(std::int32_t sender, std::int32_t index) {
  std::vector<std::byte> bytes(8 + static_cast<std::size_t>(index % 97));  // sizes vary
  std::memcpy(bytes.data(), &sender, 4);
  std::memcpy(bytes.data() + 4, &index, 4);
  return bytes;
}

TEST(MpiMailbox, NotesFromEachSenderArriveInTheOrderItSentThem) {
  Mailbox& box = mailbox();
  ASSERT_EQ(box.rank(), testing::mpi_world().rank());
  ASSERT_EQ(box.size(), testing::mpi_world().size());
  constexpr int kNotes = 50;
  for (int i = 0; i < kNotes; ++i) {
    for (int peer = 0; peer < box.size(); ++peer) {
      if (peer != box.rank()) box.send(peer, note_of(box.rank(), i));
    }
  }
  std::map<int, int> next;  // sender -> the index expected next
  for (int got = 0; got < kNotes * (box.size() - 1); ++got) {
    const auto note = box.receive(std::chrono::seconds(20));
    ASSERT_TRUE(note.has_value()) << "rank " << box.rank() << ": only " << got << " notes came";
    std::int32_t sender = -1, index = -1;
    ASSERT_GE(note->bytes.size(), 8u);
    std::memcpy(&sender, note->bytes.data(), 4);
    std::memcpy(&index, note->bytes.data() + 4, 4);
    EXPECT_EQ(sender, note->from);
    EXPECT_EQ(index, next[sender]) << "from rank " << sender;
    EXPECT_EQ(note->bytes.size(), note_of(sender, index).size());
    next[sender] = index + 1;
  }
  testing::mpi_world().barrier();
}

TEST(MpiMailbox, ReceiveReturnsNothingWhenNoNoteComesInItsWait) {
  testing::mpi_world().barrier();
  EXPECT_FALSE(mailbox().receive(std::chrono::milliseconds(30)).has_value());
  testing::mpi_world().barrier();
}

TEST(MpiMailbox, RefusesANoteToItselfOrLargerThanTheLimit) {
  Mailbox& box = mailbox();
  EXPECT_THROW(box.send(box.rank(), note_of(0, 0)), InvalidArgument);
  EXPECT_THROW(box.send(box.size(), note_of(0, 0)), InvalidArgument);
  const std::vector<std::byte> big(kMaxNoteBytes + 1);
  EXPECT_THROW(box.send((box.rank() + 1) % box.size(), big), InvalidArgument);
  testing::mpi_world().barrier();
  EXPECT_FALSE(box.receive(std::chrono::milliseconds(10)).has_value()) << "a refused note was sent";
}

TEST(MpiMailbox, ClosedReceivesNothingEvenWithANoteWaiting) {
  auto box = make_mpi_world_mailbox(std::chrono::seconds(30));  // one of its own (collective)
  box->send((box->rank() + 1) % box->size(), note_of(box->rank(), 0));
  testing::mpi_world().barrier();
  box->close();
  EXPECT_FALSE(box->receive(std::chrono::seconds(30)).has_value());
  testing::mpi_world().barrier();
}

}  // namespace
}  // namespace gradcomp
