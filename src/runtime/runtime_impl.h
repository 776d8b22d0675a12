// Runtime::Impl, the fusion runtime's engine, shared by its parts: runtime.cc (the caller-facing calls: enqueue, wait,
// synchronize, shutdown, stats), cycle.cc (the background thread: negotiation cycles, planning fusion groups and
// running them there or on the pipeline's lanes) and checkpoint.cc (save_state / load_state). Private to src/runtime.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/runtime.h"
#include "src/runtime/executor.h"
#include "src/runtime/negotiator.h"
#include "src/runtime/pipeline.h"
#include "src/runtime/timeline.h"

namespace gradcomp {

class Runtime::Impl {
 public:
  // Validates the options and the policy's specs, opens the timeline and starts the background thread.
  Impl(Communicator& comm, RuntimeOptions options);
  ~Impl() { shutdown(); }

  struct Request {
    std::uint64_t id = 0;
    std::string name;  // the negotiated key: the user's name, "[scope]name" inside a scope
    std::string user_name;  // the name as submitted: what an owner's compressor keys state and random streams by
    TensorView tensor;
    Compressor* compressor = nullptr;  // the owner's (SubmitOptions::compressor), or null: the runtime's codec
    std::uint64_t step = kStepOfCall;  // SubmitOptions::step, or kStepOfCall: the runtime counts
    runtime::Signature signature;
    CompletionCallback callback;
    runtime::Clock::time_point enqueued;
  };

  // The calls behind Runtime's public methods (see gradcomp/runtime.h).
  std::uint64_t enqueue(std::string_view name, const TensorView& tensor, const SubmitOptions& submit,
                        CompletionCallback callback);
  void wait(Handle handle);
  bool poll(Handle handle) const;
  void synchronize();
  void shutdown();
  // Closes the timeline if open, then opens `path_pattern` ("{rank}" replaced; without it only rank 0 writes).
  void start_timeline(const std::string& path_pattern, int rank);
  void stop_timeline() { timeline_.close(); }
  int rank() const { return comm_.rank(); }
  RuntimeStats stats(bool reset);
  std::vector<float> residual(std::string_view name) const { return executor_.residual(std::string(name)); }
  std::vector<std::byte> save_state() const;
  void load_state(std::span<const std::byte> state);
  // Runtime::join() (join.cc).
  int join();
  void set_fusion_threshold(std::size_t bytes) { fusion_threshold_.store(bytes); }
  std::size_t fusion_threshold() const { return fusion_threshold_.load(); }

  Communicator& comm_;
  RuntimeOptions options_;

 private:
  struct HandleState {
    bool done = false;
    Status status;
  };

  // Holding mutex_ keeps new work from starting (enqueue and the cycle's queue swap both take it); with nothing in
  // flight the background thread cannot be inside the executor, so its state may be read or replaced then.
  void require_idle(const char* what) const;
  runtime::Timeline* open_timeline(Communicator& comm);
  runtime::Clock::duration wait_budget() const { return 3 * timeout_ + std::chrono::seconds(5); }
  // Canonical form of a spec, cached.
  std::string canonical(const std::string& spec);
  // Completes one request: its handle or callback, then the in-flight count; wakes the waiters unless `notify` is
  // false (complete_all() wakes them once for a whole buffer).
  void complete(Request& request, const Status& status, bool notify = true);
  // Completes `requests` together (one lock for their handles, their callbacks, then the in-flight count); wakes
  // nobody.
  void complete_requests(std::span<Request> requests, const Status& status);
  template <typename E>
  Status error_status(const std::string& message) {
    return Status{std::make_exception_ptr(E(fmt::format("{} (rank {})", message, comm_.rank())))};
  }

  void fail_pending(const Status& status);

  // The background thread's timing: the cycle period, the idle back-off and rank 0's deadline bookkeeping.
  struct CycleClock {
    explicit CycleClock(const RuntimeOptions& options);
    // A cycle starts at `now`: the next one is due a period later, or later still while every rank is idle.
    void start(runtime::Clock::time_point now);
    // Rank 0: cycles that started more than `timeout` ago expire (expire_before).
    void advance_deadline(std::uint64_t cycle, runtime::Clock::time_point now, runtime::Clock::duration timeout);
    runtime::Clock::duration period, idle_max, idle_base;
    bool backs_off;
    runtime::Clock::time_point next;
    unsigned quiet_cycles = 0;  // consecutive cycles in which no rank had anything pending (same on every rank)
    std::deque<std::pair<std::uint64_t, runtime::Clock::time_point>> starts;
    std::uint64_t expire_before = 0;
  };
  // What a cycle starts from: this rank's flags, and its new requests (already moved into pending_).
  struct Intake {
    bool shutting_down = false;
    bool joined = false;
    std::deque<Request> requests;
  };
  // One cycle's negotiation: the gathered summary, the decision, and what it cost.
  struct Negotiation {
    runtime::CycleSummary summary;
    runtime::CycleDecision decision;
    std::uint64_t collectives = 0;
    std::size_t sent = 0;
  };
  // The background thread: one negotiation cycle after another until shutdown (cycle.cc).
  void loop();
  // The parts of a cycle (cycle.cc): wait for the cycle's time (or a wake-up) and take the queue; negotiate; count
  // it (stats, timeline, idle back-off); complete the tensors the negotiation failed.
  Intake take_incoming(const CycleClock& clock);
  Negotiation negotiate(const Intake& intake, std::uint64_t expire_before);
  void record_negotiation(const Negotiation& negotiation, runtime::Clock::time_point start, CycleClock& clock);
  void fail_decided(const std::vector<runtime::FailedTensor>& failed);
  // On a joined rank (join.cc): a request of zeros for every ready tensor this rank did not submit, so that it takes
  // part in the others' collectives; finish_join() ends join() on this rank with the rank that joined last.
  void add_join_zeros(const std::vector<runtime::ReadyTensor>& ready);
  void finish_join(int last_joined);
  // Runs the fusion groups of the tensors every rank has ready (cycle.cc): on this thread, or handed to the
  // pipeline's lanes.
  void execute(const std::vector<runtime::ReadyTensor>& ready, runtime::Clock::time_point cycle_start,
               std::uint64_t threshold);
  // Lanes for this runtime: options_.pipeline_lanes where the communicator allows threads, else 0 (cycle.cc).
  int pipeline_lanes() const;
  // Whether the pipeline holds the next cycle back (cycle.cc; background thread, mutex_ held).
  bool held_back() const;

  // A tensor reduced in parts (src/runtime/partition.h): its requests complete when the last part has finished,
  // with the first error of any part.
  struct Parts {
    std::mutex mutex;
    std::vector<Request> requests;  // (mutex)
    std::size_t remaining = 0;      // (mutex) parts not finished
    Status status;                  // (mutex) the first part's error, else ok
  };
  // One fusion group (or part of a tensor) on its way through a lane: the prepared group and the requests it
  // completes (a part's are its tensor's, in `whole`).
  struct Job {
    runtime::Executor::Prepared prepared;
    std::vector<Request> requests;
    std::shared_ptr<Parts> whole;  // set for a part: requests is empty
    std::uint64_t seq = 0;  // buffer number on this rank (stats keep buffers in this order)
  };
  // The lane of the next buffer handed to the pipeline: lane 0 when `lane_zero`, else the buffers' turn (counted
  // alike on every rank, lane-zero buffers included) modulo the lane count (cycle.cc).
  int next_lane(bool lane_zero);
  // Hands `job`'s tensor to the lanes in `parts` parts (cycle.cc).
  void dispatch_parts(Job& job, std::size_t parts);
  // Runs `job` on a lane and completes its requests (cycle.cc).
  void run_job(Job& job, runtime::Pipeline::Lane& lane);
  // Records `error` as the runtime's fatal error (the first one wins), wakes the cycle thread (which then stops the
  // runtime) and returns it as a status.
  Status fail_runtime(std::exception_ptr error);
  // Adds a finished buffer's record (buffer number `seq`) to the stats (when ok) and completes its requests with
  // `status`.
  void finish(std::vector<Request>& requests, BufferRecord record, const Status& status, std::uint64_t seq);
  void complete_all(std::vector<Request>& requests, const Status& status);

  std::chrono::milliseconds timeout_;
  std::atomic<std::size_t> fusion_threshold_;
  runtime::Timeline timeline_;
  runtime::Negotiator negotiator_;
  runtime::Executor executor_;

  mutable std::mutex mutex_;
  std::condition_variable wake_cv_, done_cv_;
  bool backing_off_ = false;  // (mutex_) the loop waits longer than a cycle: enqueue() must wake it
  bool held_back_waiting_ = false;  // (mutex_) the loop waits for a lane to finish: a lane's finish must wake it
  std::deque<Request> queue_;
  std::set<std::string> active_names_;
  std::map<std::uint64_t, HandleState> handles_;
  std::uint64_t next_id_ = 0;
  std::uint64_t in_flight_ = 0;
  bool shutdown_requested_ = false;
  bool join_requested_ = false;       // (mutex_) this rank is in join(): its negotiation messages say so
  std::optional<int> join_result_;    // (mutex_) set when every rank joined: the rank that joined last
  std::map<std::string, runtime::Executor::ResidualShape> loaded_;  // loaded residuals not yet submitted
  std::exception_ptr fatal_;

  // Refuses (InvalidArgument naming the tensor and rank) what the runtime could only fail later: a CUDA tensor
  // without a usable device, a size the codec cannot address.
  void check_servable(std::string_view name, const TensorView& tensor, const std::string& spec, Compressor* owned);

  std::mutex spec_mutex_;
  std::map<std::string, std::string> canonical_;
  std::map<std::string, std::unique_ptr<Compressor>> probes_;  // (spec_mutex_) one per spec, for check_servable
  std::map<std::string, Compressor*> scopes_;                  // (mutex_) the compressor of each scope
  std::mutex stats_mutex_;
  RuntimeStats stats_;
  std::vector<std::uint64_t> buffer_seqs_;  // (stats_mutex_) the buffer number of each of stats_.buffers
  std::uint64_t buffer_seq_ = 0;            // next buffer number (background thread only)
  std::mutex join_mutex_;
  std::thread thread_;

  std::map<std::string, Request> pending_;  // background thread only
  std::unique_ptr<runtime::Pipeline> pipeline_;  // background thread only; null: buffers run on that thread
  std::uint64_t dispatched_ = 0;                 // buffers handed to lanes (background thread only)
};

}  // namespace gradcomp
