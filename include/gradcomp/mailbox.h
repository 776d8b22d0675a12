// gradcomp/mailbox.h: short notes between the ranks of a job, outside every collective. hvd.join() uses them: a rank
// that joins tells the others, and they tell it which collective to take part in, so that no step pays a round for
// join while no rank is joined (docs/horovod-api.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace gradcomp {

// The largest note a Mailbox carries, in bytes.
inline constexpr std::size_t kMaxNoteBytes = 4096;

// A note as received: the sending rank and its bytes.
struct Note {
  int from = -1;
  std::vector<std::byte> bytes;
};

// Point-to-point notes between the ranks of the world. send() and receive() may run on different threads at once.
class Mailbox {
 public:
  virtual ~Mailbox() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `bytes` (at most kMaxNoteBytes; InvalidArgument otherwise) to rank `peer` (not this one). Returns once the
  // transport holds them; CommError when it cannot take them within the mailbox's timeout.
  virtual void send(int peer, std::span<const std::byte> bytes) = 0;
  // The next note from any rank, waiting at most `wait`; nullopt when none came. Notes from one sender arrive in the
  // order it sent them. A transport that polls sleeps between polls, doubling from 20 us up to `max_nap` (a long
  // nap for an idle listener, a short one for a rank that expects notes now).
  virtual std::optional<Note> receive(std::chrono::milliseconds wait,
                                      std::chrono::microseconds max_nap = std::chrono::milliseconds(4)) = 0;
  // Ends every receive() under way (within one nap: it returns nullopt) and makes later ones return nullopt at once.
  virtual void close() = 0;
};

// A Mailbox over a duplicate of MPI_COMM_WORLD (collective over the world: every rank creates one, in the same order
// as its other communicators). Receiving polls (a matched probe, MPI_Improbe, then a nap): idle, it costs no traffic.
// CommError in builds without MPI, and where MPI was initialized (by the caller) without MPI_THREAD_MULTIPLE.
std::unique_ptr<Mailbox> make_mpi_world_mailbox(std::chrono::milliseconds send_timeout);

}  // namespace gradcomp
