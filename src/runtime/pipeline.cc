#include "src/runtime/pipeline.h"

#include <cstdio>
#include <exception>

#include "gradcomp/error.h"

namespace gradcomp::runtime {

Pipeline::Pipeline(Communicator& comm, int lanes, std::function<void()> on_finish) : on_finish_(std::move(on_finish)) {
  GRADCOMP_CHECK(lanes >= 1, "runtime pipeline on rank {}: needs at least one lane, got {}", comm.rank(), lanes);
  for (int l = 0; l < lanes; ++l) {
    auto lane = std::make_unique<LaneState>();
    lane->comm = comm.split(0, comm.rank());
    GRADCOMP_CHECK_AS(CommError, lane->comm != nullptr, "runtime pipeline on rank {}: split gave no communicator",
                      comm.rank());
    lanes_.push_back(std::move(lane));
  }
  for (int l = 0; l < lanes; ++l) lanes_[l]->thread = std::thread([this, l] { run(l); });
}

Pipeline::~Pipeline() { stop(); }

void Pipeline::submit(int lane, Job job) {
  LaneState& state = *lanes_.at(static_cast<std::size_t>(lane));
  {
    std::lock_guard lock(mutex_);
    GRADCOMP_ASSERT(!stopping_, "runtime pipeline: submit after stop");
    state.jobs.push_back(std::move(job));
    ++in_flight_;
  }
  state.work_cv.notify_one();  // the other lanes sleep on
}

std::size_t Pipeline::in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_;
}

void Pipeline::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (auto& lane : lanes_) lane->work_cv.notify_one();
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
}

void Pipeline::run(int index) {
  LaneState& state = *lanes_[index];
  Lane lane{*state.comm, index, state.pool};
  while (true) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      state.work_cv.wait(lock, [&] { return stopping_ || !state.jobs.empty(); });
      if (state.jobs.empty()) return;  // stopping, and nothing left
      job = std::move(state.jobs.front());
      state.jobs.pop_front();
    }
    try {
      job(lane);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradcomp: runtime pipeline lane %d: a job threw: %s\n", index, e.what());
    } catch (...) {
      std::fprintf(stderr, "gradcomp: runtime pipeline lane %d: a job threw\n", index);
    }
    job = nullptr;  // its buffers go back to this lane's pool, on this thread
    {
      std::lock_guard lock(mutex_);
      --in_flight_;
    }
    if (on_finish_) on_finish_();
  }
}

}  // namespace gradcomp::runtime
