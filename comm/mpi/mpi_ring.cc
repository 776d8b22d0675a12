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
// (0x6763, comm/mpi/mpi_family.cc) and every MPI's guaranteed tag bound (32767).
constexpr std::size_t kMaxSegments = 16384;

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
    const int t = step_[j];
    const int b = recv_block(t);
    std::byte* into = slot(t, j);
    if (t >= ranks_ - 1) {
      // An allgather step writes the block into place; the reduce-scatter step u sent it from there.
      MPI_Request& sent = sends_[static_cast<std::size_t>(t - ranks_ + 1) * segments_ + j];
      int done = 0;
      call(MPI_Test(&sent, &done, MPI_STATUS_IGNORE), "MPI_Test (ring send)");
      if (!done) return false;
      into = at(first(b, j));
    }
    call(MPI_Irecv(nonnull(into), length(b, j), type_, left_, tag(j), comm_, &recvs_[j]), "MPI_Irecv (ring)");
    posted_[j] = true;
    return true;
  }

  // Segment j of its current step has arrived: add it in (reduce-scatter), pass it on, move to the next step.
  void arrived(std::size_t j) {
    const int t = step_[j];
    if (t < ranks_ - 1) {
      const int b = recv_block(t);
      call(MPI_Reduce_local(nonnull(slot(t, j)), nonnull(at(first(b, j))), length(b, j), type_, op_),
           "MPI_Reduce_local (ring)");
    }
    posted_[j] = false;
    step_[j] = t + 1;
    if (t + 1 == steps_) return;
    send(t + 1, j);
    try_post(j);
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
    if constexpr (kBlockingWaits) {
      block_until_any();
      return;
    }
    hooks_.idle(++idle, [this] { return in_flight(); });
  }

  // Simulated build (kBlockingWaits): blocks until one request in flight completes and marks it done (null), so the
  // next pass's MPI_Test of it reports completion.
  void block_until_any() {
    std::vector<MPI_Request*> live;
    for (MPI_Request& r : recvs_) {
      if (r != MPI_REQUEST_NULL) live.push_back(&r);
    }
    for (MPI_Request& r : sends_) {
      if (r != MPI_REQUEST_NULL) live.push_back(&r);
    }
    if (live.empty()) return;
    std::vector<MPI_Request> requests;
    for (MPI_Request* r : live) requests.push_back(*r);
    int index = MPI_UNDEFINED;
    call(MPI_Waitany(static_cast<int>(requests.size()), requests.data(), &index, MPI_STATUS_IGNORE),
         "MPI_Waitany (ring)");
    if (index != MPI_UNDEFINED) *live[static_cast<std::size_t>(index)] = MPI_REQUEST_NULL;
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
