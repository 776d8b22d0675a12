#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "comm/mpi/mpi_family.h"
#include "comm/mpi/mpi_support.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "gradcomp/mailbox.h"

namespace gradcomp {
namespace {

// The tag of every note (the mailbox's communicator carries nothing else).
constexpr int kNoteTag = 0x6a6e;

class MpiMailbox final : public Mailbox {
 public:
  MpiMailbox(MPI_Comm comm, std::chrono::milliseconds send_timeout) : comm_(comm), send_timeout_(send_timeout) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  ~MpiMailbox() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(int peer, std::span<const std::byte> bytes) override {
    GRADCOMP_CHECK(peer >= 0 && peer < size_ && peer != rank_, "mailbox: rank {} cannot send a note to rank {} (of {})",
                   rank_, peer, size_);
    GRADCOMP_CHECK(bytes.size() <= kMaxNoteBytes, "mailbox: a note of {} bytes (at most {})", bytes.size(),
                   kMaxNoteBytes);
    auto copy = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());  // buried with it if stuck
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Isend(mpi::nonnull(copy->data()), static_cast<int>(copy->size()), MPI_BYTE, peer, kNoteTag, comm_,
                    &request),
          "MPI_Isend", peer);
    const auto deadline = std::chrono::steady_clock::now() + send_timeout_;
    for (unsigned spins = 1;; ++spins) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test", peer);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        mpi::bury({request}, copy);
        throw CommError(fmt::format("mailbox: rank {} could not hand a note to rank {} within {} ms: the peer is gone "
                                    "or stuck",
                                    rank_, peer, send_timeout_.count()));
      }
      mpi::back_off(spins);
    }
  }

  std::optional<Note> receive(std::chrono::milliseconds wait, std::chrono::microseconds max_nap) override {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    auto nap = std::min(std::chrono::microseconds(20), max_nap);
    for (;;) {
      if (closed_.load(std::memory_order_acquire)) return std::nullopt;
      int found = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      // A matched probe: the message is this thread's, so two threads may receive at once.
      check(MPI_Improbe(MPI_ANY_SOURCE, kNoteTag, comm_, &found, &message, &status), "MPI_Improbe", -1);
      if (found) {
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        Note note;
        note.from = status.MPI_SOURCE;
        note.bytes.resize(static_cast<std::size_t>(count));
        check(MPI_Mrecv(mpi::nonnull(note.bytes.data()), count, MPI_BYTE, &message, MPI_STATUS_IGNORE), "MPI_Mrecv",
              status.MPI_SOURCE);
        return note;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, deadline - now));
      nap = std::min(nap * 2, max_nap);
    }
  }

 void close() override { closed_.store(true, std::memory_order_release); }

 private:
  void check(int rc, const char* call, int peer) const {
    if (rc != MPI_SUCCESS) {
      throw CommError(fmt::format("mailbox: {} on rank {} (peer {}) failed: {}", call, rank_, peer,
                                  mpi::error_string(rc)));
    }
  }

  MPI_Comm comm_;
  std::chrono::milliseconds send_timeout_;
  int rank_ = 0, size_ = 1;
  std::atomic<bool> closed_{false};
};

}  // namespace

std::unique_ptr<Mailbox> make_mpi_world_mailbox(std::chrono::milliseconds send_timeout) {
  GRADCOMP_CHECK(send_timeout.count() > 0, "make_mpi_world_mailbox: timeout must be positive, got {} ms",
                 send_timeout.count());
  mpi::ensure_initialized();
  // The listener receives on a thread of its own while the caller's collectives run: MPI must allow that.
  if (const std::string level = mpi_thread_level(); level != "multiple") {
    throw CommError(fmt::format("mailbox: MPI provides thread level '{}' (initialized before gradcomp?); notes need "
                                "MPI_THREAD_MULTIPLE",
                                level));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) {
    throw CommError(fmt::format("mailbox: MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi::error_string(rc)));
  }
  return std::make_unique<MpiMailbox>(comm, send_timeout);
}

}  // namespace gradcomp
