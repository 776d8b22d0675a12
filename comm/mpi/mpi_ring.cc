// The pipelined ring (comm/mpi/mpi_ring.h). Step t of 2(n-1): a reduce-scatter step for t < n-1, an allgather step
// after. At every step a rank sends one block to its right neighbour and receives one from its left; what it receives
// at step t is what it sends at step t+1, so each segment moves on as soon as it has arrived (and, in the
// reduce-scatter, been added in). Segments are independent pipelines: segment j of step t+1 waits only for segment j
// of step t.
#include "comm/mpi/mpi_ring.h"

#include <algorithm>

namespace gradcomp::mpi {
namespace {

constexpr std::size_t kSegmentBytes = std::size_t{1} << 20;
// Segment j's messages all carry tag 1 + j: a segment's steps are sent and received in order, and MPI does not let
// messages of one sender, tag and communicator overtake each other. So the tags stay below the family's poison tag
// (0x6763, comm/mpi/mpi_family.cc) and every MPI's guaranteed tag bound (32767). The simulated build (kBlockingWaits)
// keeps at most 64 segments, so blocks over 64 MiB travel in larger ones: SimGrid 3.32 scans every request of an
// MPI_Waitany per completion, and a 650 MB block in 620 segments kept a 64-rank transformer run from finishing
// (docs/scaling.md "What differs").
constexpr std::size_t kMaxSegments = kBlockingWaits ? 64 : 16384;

class Ring {
 public:
  Ring(std::byte* data, std::size_t count, MPI_Datatype type, std::size_t element_bytes, MPI_Op op, MPI_Comm comm,
       std::vector<std::byte>& scratch, const RingHooks& hooks)
      : data_(data), count_(count), type_(type), element_(element_bytes), op_(op), comm_(comm), hooks_(hooks) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &ranks_);
    right_ = (rank_ + 1) % ranks_;
    left_ = (rank_ + ranks_ - 1) % ranks_;
    steps_ = 2 * (ranks_ - 1);
    block_ = (count_ + ranks_ - 1) / ranks_;
    segment_ = std::max<std::size_t>(std::max<std::size_t>(kSegmentBytes / element_, 1),
                                     (block_ + kMaxSegments - 1) / kMaxSegments);
    segments_ = block_ == 0 ? 0 : (block_ + segment_ - 1) / segment_;
    scratch.resize(2 * block_ * element_);
    scratch_ = scratch.data();
    sends_.assign(static_cast<std::size_t>(steps_) * segments_, MPI_REQUEST_NULL);
    recvs_.assign(segments_, MPI_REQUEST_NULL);
    step_.assign(segments_, 0);
    posted_.assign(segments_, false);
  }

  void run() {
    if (ranks_ == 1 || segments_ == 0) return;
    if constexpr (kBlockingWaits) {
      run_blocking();
      return;
    }
    for (std::size_t j = 0; j < segments_; ++j) send(0, j);
    for (std::size_t j = 0; j < segments_; ++j) try_post(j);
    std::size_t finished = 0;
    unsigned idle = 0;
    while (finished < segments_) {
      bool progressed = false;
      for (std::size_t j = 0; j < segments_; ++j) {
        if (step_[j] == steps_) continue;
        if (!posted_[j]) {
          if (!try_post(j)) continue;
          progressed = true;
        }
        int done = 0;
        call(MPI_Test(&recvs_[j], &done, MPI_STATUS_IGNORE), "MPI_Test (ring receive)");
        if (!done) continue;
        progressed = true;
        arrived(j);
        if (step_[j] == steps_) ++finished;
      }
      pause(progressed, idle);
    }
    for (;;) {
      int done = 0;
      call(MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE),
           "MPI_Testall (ring sends)");
      if (done) return;
      pause(false, idle);
    }
  }

 private:
  static int mod(int a, int n) { return ((a % n) + n) % n; }

  // The block rank sends at step t; it receives at step t what it sends at step t+1.
  int send_block(int t) const {
    return t < ranks_ - 1 ? mod(rank_ - t, ranks_) : mod(rank_ + 1 - (t - ranks_ + 1), ranks_);
  }
  int recv_block(int t) const {
    return t < ranks_ - 1 ? mod(rank_ - t - 1, ranks_) : mod(rank_ - (t - ranks_ + 1), ranks_);
  }

  // Element range [first, first + n) of segment j of block b.
  std::size_t first(int b, std::size_t j) const {
    return std::min(count_, static_cast<std::size_t>(b) * block_ + j * segment_);
  }
  int length(int b, std::size_t j) const {
    const std::size_t end = std::min(count_, static_cast<std::size_t>(b + 1) * block_);
    const std::size_t begin = first(b, j);
    return static_cast<int>(std::min(segment_, end > begin ? end - begin : 0));
  }
  static int tag(std::size_t j) { return 1 + static_cast<int>(j); }
  std::byte* at(std::size_t element) const { return data_ + element * element_; }
  std::byte* slot(int t, std::size_t j) const {
    return scratch_ + (static_cast<std::size_t>(t % 2) * block_ + j * segment_) * element_;
  }

  void send(int t, std::size_t j) {
    const int b = send_block(t);
    call(MPI_Isend(nonnull(at(first(b, j))), length(b, j), type_, right_, tag(j), comm_,
                   &sends_[static_cast<std::size_t>(t) * segments_ + j]),
         "MPI_Isend (ring)");
  }

  // Posts segment j's receive of its current step, unless the memory it lands in is still being sent.
  bool try_post(std::size_t j) {
    if (step_[j] >= ranks_ - 1) {
      // An allgather step writes the block into place; the reduce-scatter step u sent it from there.
      int done = 0;
      call(MPI_Test(&blocking_send(j), &done, MPI_STATUS_IGNORE), "MPI_Test (ring send)");
      if (!done) return false;
    }
    post(j);
    return true;
  }

  // Posts segment j's receive of its current step (its memory must be free: see try_post()).
  void post(std::size_t j) {
    const int t = step_[j];
    const int b = recv_block(t);
    std::byte* into = t >= ranks_ - 1 ? at(first(b, j)) : slot(t, j);
    call(MPI_Irecv(nonnull(into), length(b, j), type_, left_, tag(j), comm_, &recvs_[j]), "MPI_Irecv (ring)");
    posted_[j] = true;
  }

  // The reduce-scatter send that reads the memory segment j's current (allgather) step receives into.
  MPI_Request& blocking_send(std::size_t j) {
    return sends_[static_cast<std::size_t>(step_[j] - ranks_ + 1) * segments_ + j];
  }

  // Segment j of its current step has arrived: add it in, pass it on, and post the next step's receive if it can.
  void arrived(std::size_t j) {
    if (advance(j)) try_post(j);
  }

  // Segment j of its current step has arrived: add it in (reduce-scatter), move to the next step and send it on.
  // Returns whether the segment has steps left.
  bool advance(std::size_t j) {
    const int t = step_[j];
    if (t < ranks_ - 1) {
      const int b = recv_block(t);
      call(MPI_Reduce_local(nonnull(slot(t, j)), nonnull(at(first(b, j))), length(b, j), type_, op_),
           "MPI_Reduce_local (ring)");
    }
    posted_[j] = false;
    step_[j] = t + 1;
    if (t + 1 == steps_) return false;
    send(t + 1, j);
    return true;
  }

  std::vector<MPI_Request> in_flight() const {
    std::vector<MPI_Request> live;
    for (MPI_Request r : recvs_) {
      if (r != MPI_REQUEST_NULL) live.push_back(r);
    }
    for (MPI_Request r : sends_) {
      if (r != MPI_REQUEST_NULL) live.push_back(r);
    }
    return live;
  }

  void call(int rc, std::string_view what) {
    if (rc != MPI_SUCCESS) hooks_.fail(rc, what, [this] { return in_flight(); });
  }

  void pause(bool progressed, unsigned& idle) {
    if (progressed) {
      idle = 0;
      return;
    }
    hooks_.idle(++idle, [this] { return in_flight(); });
  }

  // Simulated build (kBlockingWaits): every unfinished segment waits on exactly one request, its posted receive or,
  // while the receive of an allgather step cannot be posted, the reduce-scatter send that still reads the memory it
  // lands in. One MPI_Waitany over those `segments_` requests returns the one that completed, and only that segment
  // moves on; the sends that block nothing are waited for one by one at the end (SimGrid 3.32's MPI_Waitall runs a
  // waitany over the whole array per request: quadratic in the 8,680 sends of a 5.2 GB ring on 8 ranks, where it took
  // 80% of a 64-rank simulation's CPU; waiting in order reaches the same end). So each message costs O(1) MPI
  // calls, where run()'s polling tests every segment after each completion. And no request completes through
  // MPI_Test: SimGrid 3.32 then never drops it from the rank's list of activities, which every later completion
  // scans (docs/scaling.md). Same messages, same reductions in the same order: the same bytes as run().
  void run_blocking() {
    std::vector<MPI_Request> waits(segments_, MPI_REQUEST_NULL);
    for (std::size_t j = 0; j < segments_; ++j) send(0, j);
    for (std::size_t j = 0; j < segments_; ++j) waits[j] = next_wait(j);
    std::size_t finished = 0;
    while (finished < segments_) {
      int index = MPI_UNDEFINED;
      call(MPI_Waitany(static_cast<int>(segments_), waits.data(), &index, MPI_STATUS_IGNORE), "MPI_Waitany (ring)");
      if (index == MPI_UNDEFINED) {
        call(MPI_ERR_INTERN, "MPI_Waitany (ring): no request in flight");
        return;
      }
      // MPI_Waitany freed the request through its copy in `waits`: forget the original too.
      const auto j = static_cast<std::size_t>(index);
      if (posted_[j]) {
        recvs_[j] = MPI_REQUEST_NULL;
        if (!advance(j)) {
          ++finished;
          continue;
        }
      } else {
        blocking_send(j) = MPI_REQUEST_NULL;
      }
      waits[j] = next_wait(j);
    }
    for (MPI_Request& send : sends_) {
      if (send != MPI_REQUEST_NULL) call(MPI_Wait(&send, MPI_STATUS_IGNORE), "MPI_Wait (ring send)");
    }
  }

  // What segment j waits on next (kBlockingWaits): the send that blocks its receive, or the receive, posted now.
  MPI_Request next_wait(std::size_t j) {
    if (step_[j] >= ranks_ - 1 && blocking_send(j) != MPI_REQUEST_NULL) return blocking_send(j);
    post(j);
    return recvs_[j];
  }

  std::byte* data_;
  std::size_t count_;
  MPI_Datatype type_;
  std::size_t element_;
  MPI_Op op_;
  MPI_Comm comm_;
  const RingHooks& hooks_;
  int rank_ = 0, ranks_ = 1, right_ = 0, left_ = 0, steps_ = 0;
  std::size_t block_ = 0, segment_ = 1, segments_ = 0;
  std::byte* scratch_ = nullptr;
  std::vector<MPI_Request> sends_;  // [step * segments + j]
  std::vector<MPI_Request> recvs_;  // [j]: the receive of segment j's current step
  std::vector<int> step_;           // [j]: segment j's current step (steps_ when it is done)
  std::vector<bool> posted_;        // [j]: its receive is posted
};

}  // namespace

void ring_allreduce(std::byte* data, std::size_t count, MPI_Datatype type, std::size_t element_bytes, MPI_Op op,
                    MPI_Comm comm, std::vector<std::byte>& scratch, const RingHooks& hooks) {
  Ring(data, count, type, element_bytes, op, comm, scratch, hooks).run();
}

}  // namespace gradcomp::mpi
