// The runtime's background thread: negotiation cycles (one allgather of bit vectors, announcements when names are
// new, deadlines from rank 0), idle back-off, and the execution of the fusion groups every rank has ready.
#include <algorithm>

#include <fmt/format.h>

#include "comm/blobs.h"
#include "gradcomp/error.h"
#include "src/runtime/fusion.h"
#include "src/runtime/partition.h"
#include "src/runtime/runtime_impl.h"

namespace gradcomp {

using runtime::Clock;

namespace {
std::chrono::duration<double> to_seconds(Clock::duration d) { return std::chrono::duration<double>(d); }
}  // namespace

Runtime::Impl::CycleClock::CycleClock(const RuntimeOptions& options)
    : period(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(options.cycle_time_ms))),
      idle_max(std::max(period, std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double, std::milli>(options.idle_cycle_max_ms)))),
      idle_base(std::max(period, std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(1)))),
      backs_off(options.idle_cycle_max_ms > 0),
      next(Clock::now()) {}

void Runtime::Impl::CycleClock::start(Clock::time_point now) {
  next = now + period;
  if (quiet_cycles > 0 && backs_off) {
    next = now + std::min(idle_max, idle_base * (Clock::duration::rep{1} << std::min(quiet_cycles, 20u)));
  }
}

void Runtime::Impl::loop() {
  CycleClock clock(options_);
  try {
    const int lanes = pipeline_lanes();
    if (lanes > 0) {
      pipeline_ = std::make_unique<runtime::Pipeline>(comm_, lanes, [this] {
        // A lane finished a buffer: a held-back cycle may go. Only a thread held back is woken (not, per buffer, a
        // cycle timer that the finish does not concern).
        std::lock_guard lock(mutex_);
        if (held_back_waiting_) wake_cv_.notify_all();
      });
    }
    while (true) {
      const Intake intake = take_incoming(clock);
      const auto start = Clock::now();
      clock.start(start);
      if (comm_.rank() == 0) clock.advance_deadline(negotiator_.cycle(), start, timeout_);
      const Negotiation negotiation = negotiate(intake, clock.expire_before);
      record_negotiation(negotiation, start, clock);
      const runtime::CycleDecision& decision = negotiation.decision;
      fail_decided(decision.failed);
      if (intake.joined) add_join_zeros(decision.ready);
      execute(decision.ready, start, negotiation.summary.fusion_threshold);
      if (decision.all_joined) finish_join(decision.last_joined);
      if (decision.shutdown) {
        for (auto& [name, request] : pending_) negotiator_.remove_pending(name);
        fail_pending(error_status<Error>("the runtime shut down before every rank submitted this tensor"));
        break;
      }
    }
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    {
      std::lock_guard lock(mutex_);
      fatal_ = error;
      for (Request& request : queue_) pending_.emplace(request.name, std::move(request));
      queue_.clear();
    }
    fail_pending(Status{error});
  }
  // The lanes finish what was dispatched (or fail it fast once the runtime failed) before the thread ends.
  if (pipeline_) pipeline_->stop();
  pipeline_.reset();
  std::lock_guard lock(mutex_);
  shutdown_requested_ = true;
  done_cv_.notify_all();  // a join() waiting for the others learns that the runtime stopped
}

void Runtime::Impl::CycleClock::advance_deadline(std::uint64_t cycle, Clock::time_point now,
                                                 Clock::duration timeout) {
  starts.emplace_back(cycle, now);
  while (!starts.empty() && starts.front().second + timeout < now) {
    expire_before = starts.front().first + 1;
    starts.pop_front();
  }
}

Runtime::Impl::Intake Runtime::Impl::take_incoming(const CycleClock& clock) {
  Intake intake;
  {
    std::unique_lock lock(mutex_);
    held_back_waiting_ = true;
    wake_cv_.wait(lock, [&] { return shutdown_requested_ || fatal_ != nullptr || !held_back(); });
    held_back_waiting_ = false;
    const bool woken = wake_cv_.wait_until(lock, clock.next, [&] {
      return shutdown_requested_ || fatal_ != nullptr || (backing_off_ && !queue_.empty());
    });
    if (woken && backing_off_ && !shutdown_requested_ && fatal_ == nullptr) {
      // A local enqueue ended the back-off. Gather the rest of its burst (a backward pass submits many gradients
      // back to back) for one cycle period, as a cycle would, so that it travels in one cycle.
      backing_off_ = false;
      wake_cv_.wait_until(lock, Clock::now() + clock.period,
                          [&] { return shutdown_requested_ || fatal_ != nullptr; });
    }
    if (fatal_) std::rethrow_exception(fatal_);  // a lane's communication failed
    intake.shutting_down = shutdown_requested_;
    intake.joined = join_requested_;
    intake.requests.swap(queue_);
  }
  for (Request& request : intake.requests) {
    negotiator_.add_pending(request.name, request.signature);
    pending_.emplace(request.name, std::move(request));
  }
  intake.requests.clear();
  return intake;
}

Runtime::Impl::Negotiation Runtime::Impl::negotiate(const Intake& intake, std::uint64_t expire_before) {
  // One allgather of fixed-size bit vectors; two more when some rank announces new names.
  Negotiation out;
  const std::vector<std::byte> message =
      negotiator_.make_message(intake.shutting_down, expire_before, fusion_threshold_.load(), intake.joined);
  std::vector<std::byte> messages(message.size() * comm_.size());
  comm_.allgather(message, messages);
  out.collectives = 1;
  out.sent = message.size();
  out.summary = negotiator_.summarize(messages);
  std::vector<std::vector<std::byte>> blobs;
  if (out.summary.any_announcements) {
    const std::vector<std::byte> announcements = negotiator_.take_announcements();
    blobs = comm::allgather_blobs(comm_, announcements);
    out.collectives += 2;
    out.sent += sizeof(std::uint64_t) + announcements.size();
  }
  out.decision = negotiator_.decide(out.summary, blobs);
  return out;
}

void Runtime::Impl::record_negotiation(const Negotiation& negotiation, Clock::time_point start, CycleClock& clock) {
  const auto negotiated = Clock::now();
  const runtime::CycleDecision& decision = negotiation.decision;
  const bool busy = !decision.ready.empty() || !decision.failed.empty();
  clock.quiet_cycles = negotiator_.quiet(negotiation.summary) && !busy ? clock.quiet_cycles + 1 : 0;
  {
    std::lock_guard lock(mutex_);
    backing_off_ = clock.quiet_cycles > 0 && clock.backs_off;
  }
  {
    std::lock_guard lock(stats_mutex_);
    ++stats_.cycles;
    if (busy) ++stats_.busy_cycles;
    stats_.negotiation_collectives += negotiation.collectives;
    stats_.negotiation_bytes += negotiation.sent;
    stats_.negotiate_s += to_seconds(negotiated - start).count();
  }
  if (timeline_.active() && (negotiation.summary.any_announcements || busy)) {
    timeline_.event("negotiate", "negotiate", 0, start, negotiated,
                    fmt::format("{{\"cycle\":{},\"ready\":{},\"failed\":{},\"collectives\":{}}}",
                                negotiator_.cycle() - 1, decision.ready.size(), decision.failed.size(),
                                negotiation.collectives));
  }
}

void Runtime::Impl::fail_decided(const std::vector<runtime::FailedTensor>& failed) {
  for (const auto& tensor : failed) {
    auto it = pending_.find(tensor.name);
    if (it == pending_.end()) continue;
    negotiator_.remove_pending(tensor.name);
    complete(it->second, tensor.timeout ? error_status<Timeout>(tensor.message)
                                        : error_status<InvalidArgument>(tensor.message));
    pending_.erase(it);
  }
}

bool Runtime::Impl::held_back() const {
  if (!pipeline_) return false;
  const std::size_t in_flight = pipeline_->in_flight();
  // A full pipeline takes no new buffers: the tensors arriving meanwhile join the next cycle's (fewer, larger
  // messages) and the wire stays busy with the ones queued. While buffers are in flight and this rank has nothing
  // to negotiate, it does not cycle either: a rank that has joins its cycle once these buffers are done (as it would
  // have on the unpipelined path), and no idle control rounds compete with the data for the CPU.
  if (in_flight >= static_cast<std::size_t>(pipeline_->lanes())) return true;
  return in_flight > 0 && queue_.empty() && pending_.empty();
}

int Runtime::Impl::pipeline_lanes() const {
  if (options_.pipeline_lanes <= 0 || comm_.size() == 1) return 0;
  // Lanes call their communicators beside the negotiation's: MPI must allow threads (MPI_THREAD_MULTIPLE); the
  // in-process backend always does. Other backends (a torch ProcessGroup, NCCL as the runtime's communicator) keep
  // the unpipelined path. Every rank decides alike (one backend, one MPI library).
  const std::string backend = comm_.backend();
  if (backend == "local") return options_.pipeline_lanes;
  if (backend == "mpi" && mpi_thread_level() == "multiple") return options_.pipeline_lanes;
  return 0;
}

void Runtime::Impl::execute(const std::vector<runtime::ReadyTensor>& ready, Clock::time_point cycle_start,
                            std::uint64_t threshold) {
  if (ready.empty()) return;
  for (const auto& tensor : ready) {
    const Request& request = pending_.at(tensor.name);
    std::lock_guard lock(stats_mutex_);
    stats_.queue_s += to_seconds(cycle_start - request.enqueued).count();
    if (timeline_.active()) {
      timeline_.event(tensor.name, "queue", 2, request.enqueued, cycle_start);
    }
  }
  // An error of a buffer's own work (its codec refusing a value, a corrupt payload) fails its tensors alone: it is
  // returned. A communication failure leaves the communicator unusable: it fails the tensors and stops the runtime
  // (rethrown to the loop's handler; on a lane, fail_runtime()).
  auto guarded = [this](std::vector<Request>& requests, auto&& work) -> Status {
    try {
      work();
    } catch (const CommError&) {
      complete_all(requests, Status{std::current_exception()});
      throw;
    } catch (const Timeout&) {
      complete_all(requests, Status{std::current_exception()});
      throw;
    } catch (const Error&) {
      return Status{std::current_exception()};
    }
    return Status{};
  };
  const auto groups = runtime::plan_fusion(ready, threshold,
                                           [&](std::size_t i) {
                                             const auto& sig = ready[i].signature;
                                             const std::size_t limit = options_.fusion_tensor_limit_bytes;
                                             return limit == 0 || sig.numel * dtype_size(sig.dtype) <= limit;
                                           });
  for (const auto& group : groups) {
    // The group's requests leave the pending set now: the next cycle may be negotiated while it runs.
    auto job = std::make_shared<Job>();
    std::vector<runtime::Executor::Member> members;
    for (std::size_t index : group.members) {
      auto it = pending_.find(ready[index].name);
      Request& request = it->second;
      members.push_back({request.name, request.user_name, request.tensor, request.compressor, request.step});
      negotiator_.remove_pending(request.name);
      job->requests.push_back(std::move(request));
      pending_.erase(it);
    }
    if (!pipeline_) {
      BufferRecord record;
      const Status status = guarded(job->requests, [&] { record = executor_.execute(group, std::move(members)); });
      finish(job->requests, std::move(record), status, buffer_seq_++);
      continue;
    }
    const Status status = guarded(job->requests, [&] { job->prepared = executor_.prepare(group, std::move(members)); });
    if (!status.ok()) {
      finish(job->requests, BufferRecord{}, status, buffer_seq_++);
      continue;
    }
    // Every rank numbers its buffers alike, so lane l's communicator sees the same collectives everywhere: what
    // decides parts and lanes comes from the negotiated signature, not from this rank's memory (a joined rank serves
    // a CUDA tensor with host zeros, join.cc, and must still cut it and place it as the ranks that hold it do).
    const bool device_tensor = !ready[group.members.front()].signature.device.is_cpu();
    const std::size_t parts =
        pipeline_->lanes() >= 2 && !device_tensor
            ? runtime::partition_count(job->prepared, options_.partition_bytes, options_.algorithm)
            : 1;
    if (parts > 1) {
      dispatch_parts(*job, parts);
      continue;
    }
    // Rounds codecs keep state between their calls (one reduction of an instance at a time) and device buffers may
    // use RuntimeOptions::device_comm (one thread): both always take lane 0.
    const bool lane_zero = device_tensor || job->prepared.compressor->traits().rounds;
    const int lane = next_lane(lane_zero);
    job->seq = buffer_seq_++;
    pipeline_->submit(lane, [this, job](runtime::Pipeline::Lane& on) { run_job(*job, on); });
  }
}

int Runtime::Impl::next_lane(bool lane_zero) {
  const auto turn = dispatched_++;
  return lane_zero ? 0 : static_cast<int>(turn % static_cast<std::uint64_t>(pipeline_->lanes()));
}

void Runtime::Impl::dispatch_parts(Job& job, std::size_t parts) {
  auto whole = std::make_shared<Parts>();
  whole->requests = std::move(job.requests);
  whole->remaining = parts;
  // Parts take lanes in turn as buffers do (every rank the same), so that part i+1 is encoded while part i is on
  // the wire.
  for (std::size_t i = 0; i < parts; ++i) {
    auto part = std::make_shared<Job>();
    part->prepared = runtime::partition_part(job.prepared, i, parts);
    part->whole = whole;
    part->seq = buffer_seq_++;
    pipeline_->submit(next_lane(false), [this, part](runtime::Pipeline::Lane& on) { run_job(*part, on); });
  }
}

void Runtime::Impl::run_job(Job& job, runtime::Pipeline::Lane& lane) {
  BufferRecord record;
  Status status;
  {
    std::lock_guard lock(mutex_);
    if (fatal_) status = Status{fatal_};  // the runtime stopped: the lane's peers may never join this collective
  }
  if (status.ok()) {
    try {
      record = executor_.run(job.prepared, lane.comm, lane.pool, lane.index);
    } catch (const CommError&) {
      status = fail_runtime(std::current_exception());
    } catch (const Timeout&) {
      status = fail_runtime(std::current_exception());
    } catch (const Error&) {
      status = Status{std::current_exception()};
    } catch (...) {
      status = fail_runtime(std::current_exception());
    }
  }
  finish(job.requests, std::move(record), status, job.seq);
  if (!job.whole) return;
  std::vector<Request> done;
  Status first;
  {
    std::lock_guard lock(job.whole->mutex);
    if (!status.ok() && job.whole->status.ok()) job.whole->status = status;
    if (--job.whole->remaining > 0) return;
    done = std::move(job.whole->requests);
    first = job.whole->status;
  }
  complete_all(done, first);
}

Status Runtime::Impl::fail_runtime(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (!fatal_) fatal_ = error;
  }
  wake_cv_.notify_all();  // the cycle thread rethrows it at its next cycle
  return Status{error};
}

void Runtime::Impl::finish(std::vector<Request>& requests, BufferRecord record, const Status& status,
                           std::uint64_t seq) {
  if (status.ok()) {
    std::lock_guard lock(stats_mutex_);
    ++stats_.messages;
    stats_.input_bytes += record.input_bytes;
    stats_.wire_bytes += record.wire_bytes;
    stats_.staged_bytes += record.staged_bytes;
    stats_.allocations += record.allocations;
    stats_.copy_bytes += record.copy_bytes;
    if (record.tensors == 1) stats_.alone_bytes += record.input_bytes;
    if (record.gathered) stats_.gathered_bytes += record.input_bytes;
    stats_.copy_in_s += record.copy_in_s;
    stats_.compress_s += record.compress_s;
    stats_.communicate_s += record.communicate_s;
    stats_.decompress_s += record.decompress_s;
    stats_.copy_out_s += record.copy_out_s;
    // In dispatch order (lanes finish out of order): the last 1024, oldest first.
    auto at = buffer_seqs_.end();
    while (at != buffer_seqs_.begin() && *(at - 1) > seq) --at;
    stats_.buffers.insert(stats_.buffers.begin() + (at - buffer_seqs_.begin()), std::move(record));
    buffer_seqs_.insert(at, seq);
    if (stats_.buffers.size() > 1024) {
      stats_.buffers.erase(stats_.buffers.begin());
      buffer_seqs_.erase(buffer_seqs_.begin());
    }
  }
  complete_all(requests, status);
}

void Runtime::Impl::complete_all(std::vector<Request>& requests, const Status& status) {
  complete_requests(requests, status);
  requests.clear();
  done_cv_.notify_all();
}

}  // namespace gradcomp
