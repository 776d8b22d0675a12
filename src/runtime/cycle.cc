// The runtime's background thread: negotiation cycles (one allgather of bit vectors, announcements when names are
// new, deadlines from rank 0), idle back-off, and the execution of the fusion groups every rank has ready.
#include <algorithm>

#include <fmt/format.h>

#include "comm/comm_util.h"
#include "gradcomp/error.h"
#include "src/runtime/fusion.h"
#include "src/runtime/runtime_impl.h"

namespace gradcomp {

using runtime::Clock;

namespace {
std::chrono::duration<double> to_seconds(Clock::duration d) { return std::chrono::duration<double>(d); }
}  // namespace

void Runtime::Impl::loop() {
  const auto cycle = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(options_.cycle_time_ms));
  const auto idle_max = std::max(cycle, std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double, std::milli>(options_.idle_cycle_max_ms)));
  const auto idle_base = std::max(cycle, std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(1)));
  unsigned quiet_cycles = 0;  // consecutive cycles in which no rank had anything pending (same on every rank)
  std::deque<std::pair<std::uint64_t, Clock::time_point>> cycle_starts;  // rank 0's deadline bookkeeping
  std::uint64_t expire_before = 0;
  auto next = Clock::now();
  try {
    while (true) {
      bool shutting_down = false;
      std::deque<Request> incoming;
      {
        std::unique_lock lock(mutex_);
        wake_cv_.wait_until(lock, next, [&] { return shutdown_requested_ || (backing_off_ && !queue_.empty()); });
        shutting_down = shutdown_requested_;
        incoming.swap(queue_);
      }
      const auto start = Clock::now();
      next = start + cycle;
      if (quiet_cycles > 0 && options_.idle_cycle_max_ms > 0) {
        next = start + std::min(idle_max, idle_base * (Clock::duration::rep{1} << std::min(quiet_cycles, 20u)));
      }
      for (Request& request : incoming) {
        negotiator_.add_pending(request.name, request.signature);
        pending_.emplace(request.name, std::move(request));
      }
      if (comm_.rank() == 0) {
        cycle_starts.emplace_back(negotiator_.cycle(), start);
        while (!cycle_starts.empty() && cycle_starts.front().second + timeout_ < start) {
          expire_before = cycle_starts.front().first + 1;
          cycle_starts.pop_front();
        }
      }

      // Negotiate: one allgather of fixed-size bit vectors; two more when some rank announces new names.
      const std::vector<std::byte> message =
          negotiator_.make_message(shutting_down, expire_before, fusion_threshold_.load());
      std::vector<std::byte> messages(message.size() * comm_.size());
      comm_.allgather(message, messages);
      std::uint64_t collectives = 1;
      runtime::CycleSummary summary = negotiator_.summarize(messages);
      std::vector<std::vector<std::byte>> blobs;
      if (summary.any_announcements) {
        blobs = comm::allgather_blobs(comm_, negotiator_.take_announcements());
        collectives += 2;
      }
      runtime::CycleDecision decision = negotiator_.decide(summary, blobs);
      const auto negotiated = Clock::now();
      quiet_cycles = negotiator_.quiet(summary) && decision.ready.empty() && decision.failed.empty()
                         ? quiet_cycles + 1
                         : 0;
      {
        std::lock_guard lock(mutex_);
        backing_off_ = quiet_cycles > 0 && options_.idle_cycle_max_ms > 0;
      }
      {
        std::lock_guard lock(stats_mutex_);
        ++stats_.cycles;
        stats_.negotiation_collectives += collectives;
        stats_.negotiate_s += to_seconds(negotiated - start).count();
      }
      if (timeline_.active() && (summary.any_announcements || !decision.ready.empty() || !decision.failed.empty())) {
        timeline_.event("negotiate", "negotiate", 0, start, negotiated,
                        fmt::format("{{\"cycle\":{},\"ready\":{},\"failed\":{},\"collectives\":{}}}",
                                    negotiator_.cycle() - 1, decision.ready.size(), decision.failed.size(),
                                    collectives));
      }

      for (const auto& failed : decision.failed) {
        auto it = pending_.find(failed.name);
        if (it == pending_.end()) continue;
        negotiator_.remove_pending(failed.name);
        complete(it->second, failed.timeout ? error_status<Timeout>(failed.message)
                                            : error_status<InvalidArgument>(failed.message));
        pending_.erase(it);
      }
      execute(decision.ready, start, summary.fusion_threshold);

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
  std::lock_guard lock(mutex_);
  shutdown_requested_ = true;
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
  const auto groups = runtime::plan_fusion(ready, threshold,
                                           [&](std::size_t i) {
                                             const auto& sig = ready[i].signature;
                                             const std::size_t limit = options_.fusion_tensor_limit_bytes;
                                             return limit == 0 || sig.numel * dtype_size(sig.dtype) <= limit;
                                           });
  for (const auto& group : groups) {
    std::vector<runtime::Executor::Member> members;
    for (std::size_t index : group.members) {
      const Request& request = pending_.at(ready[index].name);
      members.push_back({&ready[index], request.tensor, request.compressor, request.user_name, request.step});
    }
    // An error of this buffer's own work (its codec refusing a value, a corrupt payload) fails its tensors alone;
    // a communication failure leaves the communicator unusable and stops the runtime (the loop's handler).
    BufferRecord record;
    Status status;
    try {
      record = executor_.execute(group, members);
    } catch (const CommError&) {
      throw;
    } catch (const Timeout&) {
      throw;
    } catch (const Error&) {
      status = Status{std::current_exception()};
    }
    if (status.ok()) {
      std::lock_guard lock(stats_mutex_);
      ++stats_.messages;
      stats_.input_bytes += record.input_bytes;
      stats_.wire_bytes += record.wire_bytes;
      stats_.staged_bytes += record.staged_bytes;
      stats_.allocations += record.allocations;
      stats_.copy_in_s += record.copy_in_s;
      stats_.compress_s += record.compress_s;
      stats_.communicate_s += record.communicate_s;
      stats_.decompress_s += record.decompress_s;
      stats_.copy_out_s += record.copy_out_s;
      stats_.buffers.push_back(std::move(record));
      if (stats_.buffers.size() > 1024) stats_.buffers.erase(stats_.buffers.begin());
    }
    for (const auto& member : members) {
      auto it = pending_.find(member.ready->name);
      negotiator_.remove_pending(member.ready->name);
      complete(it->second, status);
      pending_.erase(it);
    }
  }
}

}  // namespace gradcomp
