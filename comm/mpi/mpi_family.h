// comm/mpi: what a failure leaves behind. A world communicator and every communicator split from it (directly or
// not) form one family that fails as a whole, like the local backend's group: after the first Timeout or MPI error
// on any rank, every call of every member on every rank that hears of it throws CommError at once.
//
// Hearing of it: the failing rank sends a short "poison" message (its rank and the first failure) to every other
// rank of the family's root communicator (the world duplicate), with a tag no collective uses; every rank keeps a
// receive for it posted and tests it before each call and while waiting, so a rank stuck in a collective that can
// no longer finish (its peer gave up) fails as soon as the message arrives instead of at its own deadline.
//
// Abandoned operations: MPI cannot cancel a non-blocking collective, and a resumed or slow peer can still complete
// it, writing into its buffers. So the communicator never hands MPI the caller's memory (it copies into buffers it
// owns), and an abandoned request is buried with those buffers in a process-lifetime graveyard: never tested,
// waited or freed, never completed into memory the caller may have freed.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/mpi/mpi_support.h"

namespace gradcomp::mpi {

// Keeps `requests` (started, never to be completed by us) and `keep_alive` (every buffer they read or write) alive
// until the process exits.
void bury(std::vector<MPI_Request> requests, std::shared_ptr<void> keep_alive);

// Number of buried requests so far (for tests and diagnostics).
std::size_t buried_count();

class MpiFamily {
 public:
  // Takes ownership of `root` (a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN) and posts the poison receive.
  explicit MpiFamily(MPI_Comm root);
  // Unbroken: cancels the poison receive and frees `root`. Broken: buries the receive, leaves `root` to MPI.
  ~MpiFamily();
  MpiFamily(const MpiFamily&) = delete;
  MpiFamily& operator=(const MpiFamily&) = delete;

  MPI_Comm root() const { return root_; }
  // This process's rank in the root communicator, and its size.
  int root_rank() const { return root_rank_; }
  int root_size() const { return root_size_; }
  bool broken() const { return broken_.load(std::memory_order_acquire); }

  // Polls the poison receive once (non-blocking); true when the family is broken (now or before).
  bool poll();

  // Records `what` (which names the failing rank and operation) as the family's failure unless one is recorded,
  // then tells every other rank of the root communicator. Returns the recorded (first) failure.
  std::string fail(const std::string& what);

  // The first failure ("" while unbroken).
  std::string failure() const;

 private:
  // Posts an Isend of the poison to every other root rank, pushes them for a moment, buries what is unfinished.
  void send_poison(const std::string& what);

  struct Inbox;  // the poison receive and its buffer (buried with the request when abandoned)

  MPI_Comm root_;
  int root_rank_ = 0, root_size_ = 1;
  std::shared_ptr<Inbox> inbox_;
  std::atomic<bool> broken_{false};
  mutable std::mutex mutex_;  // guards failure_ and the inbox request
  std::string failure_;
};

}  // namespace gradcomp::mpi
