// The runtime's pipeline: lanes that execute fusion buffers beside the negotiation thread. Each lane is one thread
// with its own data communicator (split from the runtime's at start, so its collectives never interleave with the
// negotiation's or another lane's) and a FIFO of jobs. Buffer b of the runtime goes to lane b mod L on every rank, so
// each lane's communicator sees the same collectives in the same order everywhere. With two lanes, while buffer i is
// on the wire (lane i mod 2), buffer i+1 is packed and compressed and buffer i-1 decoded and unpacked (the other
// lane), and the next cycle is negotiated on the runtime's thread meanwhile. Private to src/runtime.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/algorithms/buffer_pool.h"
#include "gradcomp/communicator.h"

namespace gradcomp::runtime {

class Pipeline {
 public:
  // What a lane gives a job: its data communicator, its index and its host fusion-buffer pool.
  struct Lane {
    Communicator& comm;
    int index;
    algorithms::BlockPool& pool;
  };
  using Job = std::function<void(Lane&)>;

  // Splits `comm` into `lanes` data communicators (collective on `comm`: every rank constructs a Pipeline with the
  // same count at the same point) and starts one thread per lane. lanes >= 1. `on_finish` (may be empty) runs on the
  // lane after each job, once in_flight() counts it no more.
  Pipeline(Communicator& comm, int lanes, std::function<void()> on_finish = {});
  // stop().
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int lanes() const { return static_cast<int>(lanes_.size()); }
  // Queues `job` on lane `lane`; a lane runs its jobs one after another in submission order. A job must not throw
  // (it reports its own errors); one that does is reported on stderr.
  void submit(int lane, Job job);
  // Jobs submitted and not yet finished, over all lanes.
  std::size_t in_flight() const;
  // Runs the queued jobs, then joins the threads. Idempotent.
  void stop();

 private:
  struct LaneState {
    std::unique_ptr<Communicator> comm;
    algorithms::BlockPool pool{algorithms::host_allocator()};
    std::deque<Job> jobs;
    std::condition_variable work_cv;  // (with mutex_) a job for this lane, or stop: wakes this lane alone
    std::thread thread;
  };
  void run(int lane);

  std::function<void()> on_finish_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<LaneState>> lanes_;
  std::size_t in_flight_ = 0;  // (mutex_) submitted, not finished
  bool stopping_ = false;      // (mutex_)
};

}  // namespace gradcomp::runtime
