#include "gradcomp/runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "compressors/state_io.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "src/runtime/executor.h"
#include "src/runtime/fusion.h"
#include "src/runtime/negotiator.h"
#include "src/runtime/policy.h"
#include "src/runtime/timeline.h"

namespace gradcomp {

using runtime::Clock;

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

constexpr std::uint32_t kStateMagic = 0x53524347;  // "GCRS"
constexpr std::uint32_t kStateVersion = 2;  // 2: residuals live in the codecs, keyed by tensor name

// FNV-1a, 64 bit: catches damaged checkpoints before any field is interpreted.
std::uint64_t checksum(std::span<const std::byte> bytes) {
  std::uint64_t hash = 1469598103934665603ull;
  for (std::byte b : bytes) {
    hash ^= std::to_integer<std::uint64_t>(b);
    hash *= 1099511628211ull;
  }
  return hash;
}

std::chrono::duration<double> to_seconds(Clock::duration d) { return std::chrono::duration<double>(d); }

std::size_t env_bytes(const char* name, std::size_t fallback) {
  if (const char* value = env(name)) {
    char* end = nullptr;
    const unsigned long long bytes = std::strtoull(value, &end, 10);
    GRADCOMP_CHECK(end != value && *end == '\0', "{}='{}' is not a byte count", name, value);
    return static_cast<std::size_t>(bytes);
  }
  return fallback;
}

}  // namespace

std::size_t default_fusion_threshold() { return env_bytes("GRADCOMP_FUSION_THRESHOLD", std::size_t{64} << 20); }

std::size_t default_fusion_tensor_limit() { return env_bytes("GRADCOMP_FUSION_TENSOR_LIMIT", std::size_t{1} << 20); }

std::string default_timeline_path() {
  const char* value = env("GRADCOMP_TIMELINE");
  return value != nullptr ? value : "";
}

double default_cycle_time_ms() {
  if (const char* value = env("GRADCOMP_CYCLE_TIME_MS")) {
    char* end = nullptr;
    const double ms = std::strtod(value, &end);
    GRADCOMP_CHECK(end != value && *end == '\0' && ms >= 0, "GRADCOMP_CYCLE_TIME_MS='{}' is not a duration", value);
    return ms;
  }
  return 1.0;
}

double default_idle_cycle_max_ms() {
  if (const char* value = env("GRADCOMP_IDLE_CYCLE_MAX_MS")) {
    char* end = nullptr;
    const double ms = std::strtod(value, &end);
    GRADCOMP_CHECK(end != value && *end == '\0' && ms >= 0, "GRADCOMP_IDLE_CYCLE_MAX_MS='{}' is not a duration",
                   value);
    return ms;
  }
  return 50.0;
}

std::string Status::message() const {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

void Status::rethrow() const {
  if (error) std::rethrow_exception(error);
}

double RuntimeStats::compression_ratio() const {
  return wire_bytes == 0 ? 0.0 : static_cast<double>(input_bytes) / static_cast<double>(wire_bytes);
}

class Runtime::Impl {
 public:
  Impl(Communicator& comm, RuntimeOptions options)
      : comm_(comm),
        options_(std::move(options)),
        timeout_(options_.timeout.count() > 0 ? options_.timeout : comm.timeout()),
        fusion_threshold_(options_.fusion_threshold_bytes),
        negotiator_(comm.rank(), comm.size(), options_.cache_capacity),
        executor_(comm, options_, open_timeline(comm)) {
    GRADCOMP_CHECK(options_.cycle_time_ms >= 0, "cycle_time_ms must be >= 0, got {}", options_.cycle_time_ms);
    GRADCOMP_CHECK(options_.idle_cycle_max_ms >= 0, "idle_cycle_max_ms must be >= 0, got {}",
                   options_.idle_cycle_max_ms);
    for (const auto& rule : options_.policy.rules) canonical(rule.spec);
    canonical(options_.policy.default_spec.empty() ? "none" : options_.policy.default_spec);
    for (const auto& spec : options_.policy.auto_candidates) canonical(spec);
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() { shutdown(); }

  struct Request {
    std::uint64_t id = 0;
    std::string name;
    TensorView tensor;
    runtime::Signature signature;
    CompletionCallback callback;
    Clock::time_point enqueued;
  };

  std::uint64_t enqueue(std::string_view name, const TensorView& tensor, std::string_view spec,
                        CompletionCallback callback) {
    GRADCOMP_CHECK(!name.empty(), "allreduce_async on rank {}: the tensor name must not be empty", comm_.rank());
    GRADCOMP_CHECK(tensor.device().is_cpu() || GRADCOMP_WITH_CUDA,
                   "allreduce_async('{}') on rank {}: {} is a CUDA tensor but gradcomp was built without CUDA", name,
                   comm_.rank(), tensor.describe());
    if (tensor.device().is_cuda() && options_.device_comm != nullptr) {
      GRADCOMP_CHECK(options_.device_comm->size() == comm_.size() && options_.device_comm->rank() == comm_.rank(),
                     "allreduce_async('{}') on rank {}: RuntimeOptions::device_comm is rank {} of {}, the runtime's "
                     "communicator rank {} of {}",
                     name, comm_.rank(), options_.device_comm->rank(), options_.device_comm->size(), comm_.rank(),
                     comm_.size());
    }
    std::string resolved =
        spec.empty() ? runtime::resolve_spec(options_.policy, name, tensor.bytes()) : std::string(spec);
    Request request;
    request.name = std::string(name);
    request.tensor = tensor;
    request.signature = {tensor.numel(), tensor.dtype(), tensor.device(), canonical(resolved)};
    request.callback = std::move(callback);
    request.enqueued = Clock::now();
    std::lock_guard lock(mutex_);
    if (fatal_) std::rethrow_exception(fatal_);
    GRADCOMP_CHECK(!shutdown_requested_, "allreduce_async('{}') on rank {}: the runtime is shut down", name,
                   comm_.rank());
    if (auto it = loaded_.find(request.name); it != loaded_.end()) {
      // First submission of a name whose residual came from load_state(): it must be the tensor it was saved for.
      const bool auto_spec = request.signature.spec == runtime::kAutoSpec;
      GRADCOMP_CHECK(tensor.numel() == it->second.numel &&
                         (auto_spec || it->second.spec.empty() || it->second.spec == request.signature.spec),
                     "allreduce_async('{}') on rank {}: the loaded runtime state holds state of {} elements for "
                     "spec '{}', but the tensor is {} with spec '{}'",
                     name, comm_.rank(), it->second.numel, it->second.spec, tensor.describe(), request.signature.spec);
      loaded_.erase(it);
    }
    GRADCOMP_CHECK(active_names_.insert(request.name).second,
                   "allreduce_async('{}') on rank {}: a tensor of that name is still pending", name, comm_.rank());
    request.id = ++next_id_;
    if (!request.callback) handles_[request.id] = HandleState{};
    ++in_flight_;
    queue_.push_back(std::move(request));
    const std::uint64_t id = next_id_;
    if (backing_off_) wake_cv_.notify_one();  // (under mutex_: the loop cannot miss it)
    return id;
  }

  void wait(Handle handle) {
    std::unique_lock lock(mutex_);
    auto it = handles_.find(handle.id);
    GRADCOMP_CHECK(it != handles_.end(), "wait on rank {}: unknown or already waited handle {}", comm_.rank(),
                   handle.id);
    const auto deadline = Clock::now() + wait_budget();
    if (!done_cv_.wait_until(lock, deadline, [&] { return handles_.at(handle.id).done; })) {
      throw Timeout(fmt::format("wait on rank {}: handle {} did not complete within {} ms", comm_.rank(), handle.id,
                                std::chrono::duration_cast<std::chrono::milliseconds>(wait_budget()).count()));
    }
    Status status = handles_.at(handle.id).status;
    handles_.erase(handle.id);
    lock.unlock();
    status.rethrow();
  }

  bool poll(Handle handle) const {
    std::lock_guard lock(mutex_);
    auto it = handles_.find(handle.id);
    GRADCOMP_CHECK(it != handles_.end(), "poll on rank {}: unknown or already waited handle {}", comm_.rank(),
                   handle.id);
    return it->second.done;
  }

  void synchronize() {
    std::unique_lock lock(mutex_);
    const auto deadline = Clock::now() + wait_budget();
    if (!done_cv_.wait_until(lock, deadline, [&] { return in_flight_ == 0; })) {
      throw Timeout(fmt::format("synchronize on rank {}: {} tensor(s) still pending after {} ms", comm_.rank(),
                                in_flight_,
                                std::chrono::duration_cast<std::chrono::milliseconds>(wait_budget()).count()));
    }
    Status first;
    for (auto it = handles_.begin(); it != handles_.end();) {
      if (it->second.done) {
        if (first.ok() && !it->second.status.ok()) first = it->second.status;
        it = handles_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    first.rethrow();
  }

  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      shutdown_requested_ = true;
    }
    wake_cv_.notify_all();
    std::lock_guard join_lock(join_mutex_);
    if (thread_.joinable()) thread_.join();
    timeline_.close();
  }

  RuntimeStats stats(bool reset) {
    std::lock_guard lock(stats_mutex_);
    RuntimeStats out = stats_;
    if (reset) stats_ = RuntimeStats{};
    return out;
  }

  std::vector<float> residual(std::string_view name) const { return executor_.residual(std::string(name)); }

  // Holding mutex_ keeps new work from starting (enqueue and the cycle's queue swap both take it); with nothing in
  // flight the background thread cannot be inside the executor, so its state may be read or replaced here.
  void require_idle(const char* what) const {
    if (fatal_) std::rethrow_exception(fatal_);
    GRADCOMP_CHECK(in_flight_ == 0 && queue_.empty(),
                   "{} on rank {}: {} tensor(s) still pending; call synchronize() first", what, comm_.rank(),
                   in_flight_);
  }

  std::vector<std::byte> save_state() const {
    std::lock_guard lock(mutex_);
    require_idle("Runtime::save_state");
    ByteWriter body;
    body.put<std::uint32_t>(static_cast<std::uint32_t>(comm_.size()));
    body.put<std::uint32_t>(static_cast<std::uint32_t>(comm_.rank()));
    executor_.save_state(body);
    const std::vector<std::byte> bytes = body.take();
    ByteWriter out;
    out.put<std::uint32_t>(kStateMagic);
    out.put<std::uint32_t>(kStateVersion);
    out.put<std::uint64_t>(checksum(bytes));
    out.put_array(std::span<const std::byte>(bytes));
    return out.take();
  }

  void load_state(std::span<const std::byte> state) {
    ByteReader outer(state, fmt::format("runtime state on rank {}", comm_.rank()));
    GRADCOMP_CHECK_AS(CorruptPayload, outer.get<std::uint32_t>() == kStateMagic,
                      "Runtime::load_state on rank {}: not a runtime state (bad magic)", comm_.rank());
    const auto version = outer.get<std::uint32_t>();
    GRADCOMP_CHECK_AS(CorruptPayload, version == kStateVersion,
                      "Runtime::load_state on rank {}: state format version {}, this build reads {}", comm_.rank(),
                      version, kStateVersion);
    const auto sum = outer.get<std::uint64_t>();
    const std::vector<std::byte> bytes = outer.get_array<std::byte>();
    GRADCOMP_CHECK_AS(CorruptPayload, outer.at_end() && checksum(bytes) == sum,
                      "Runtime::load_state on rank {}: corrupt state (checksum mismatch or trailing bytes)",
                      comm_.rank());
    ByteReader reader(bytes, fmt::format("runtime state on rank {}", comm_.rank()));
    const auto world = reader.get<std::uint32_t>();
    const auto rank = reader.get<std::uint32_t>();
    GRADCOMP_CHECK(world == static_cast<std::uint32_t>(comm_.size()) &&
                       rank == static_cast<std::uint32_t>(comm_.rank()),
                   "Runtime::load_state on rank {} of {}: the state was saved by rank {} of {} (states are per rank)",
                   comm_.rank(), comm_.size(), rank, world);
    std::lock_guard lock(mutex_);
    require_idle("Runtime::load_state");
    auto shapes = executor_.load_state(reader);
    GRADCOMP_CHECK_AS(CorruptPayload, reader.at_end(), "Runtime::load_state on rank {}: {} trailing bytes",
                      comm_.rank(), reader.remaining());
    loaded_ = std::move(shapes);
  }
  void set_fusion_threshold(std::size_t bytes) { fusion_threshold_.store(bytes); }
  std::size_t fusion_threshold() const { return fusion_threshold_.load(); }

  Communicator& comm_;
  RuntimeOptions options_;

 private:
  struct HandleState {
    bool done = false;
    Status status;
  };

  runtime::Timeline* open_timeline(Communicator& comm) {
    if (options_.timeline_path.empty()) return nullptr;
    std::string path = options_.timeline_path;
    const auto at = path.find("{rank}");
    if (at != std::string::npos) path.replace(at, 6, std::to_string(comm.rank()));
    if (at == std::string::npos && comm.rank() != 0) return nullptr;
    timeline_.open(path, comm.rank());
    return &timeline_;
  }

  Clock::duration wait_budget() const { return 3 * timeout_ + std::chrono::seconds(5); }

  std::string canonical(const std::string& spec) {
    std::lock_guard lock(spec_mutex_);
    auto it = canonical_.find(spec);
    if (it != canonical_.end()) return it->second;
    std::string value = runtime::canonical_spec(spec);
    canonical_.emplace(spec, value);
    return value;
  }

  void complete(Request& request, const Status& status) {
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.tensors;
    }
    CompletionCallback callback;
    {
      std::lock_guard lock(mutex_);
      active_names_.erase(request.name);
      if (request.callback) {
        callback = std::move(request.callback);
      } else {
        handles_[request.id] = HandleState{true, status};
      }
    }
    if (callback) {
      try {
        callback(status);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gradcomp: completion callback of '%s' threw: %s\n", request.name.c_str(), e.what());
      } catch (...) {
        std::fprintf(stderr, "gradcomp: completion callback of '%s' threw\n", request.name.c_str());
      }
    }
    {
      std::lock_guard lock(mutex_);
      --in_flight_;
    }
    done_cv_.notify_all();
  }

  template <typename E>
  Status error_status(const std::string& message) {
    return Status{std::make_exception_ptr(E(fmt::format("{} (rank {})", message, comm_.rank())))};
  }

  void fail_pending(const Status& status) {
    for (auto& [name, request] : pending_) complete(request, status);
    pending_.clear();
  }

  void loop() {
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
          const std::vector<std::byte> mine = negotiator_.take_announcements();
          const std::uint64_t my_size = mine.size();
          std::vector<std::uint64_t> sizes(comm_.size());
          comm_.allgather(std::as_bytes(std::span<const std::uint64_t>(&my_size, 1)),
                          std::as_writable_bytes(std::span<std::uint64_t>(sizes)));
          std::vector<std::size_t> counts(sizes.begin(), sizes.end());
          std::size_t total = 0;
          for (std::size_t c : counts) total += c;
          std::vector<std::byte> all(total);
          comm_.allgatherv(mine, counts, all);
          collectives += 2;
          std::size_t offset = 0;
          for (std::size_t c : counts) {
            blobs.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(offset),
                               all.begin() + static_cast<std::ptrdiff_t>(offset + c));
            offset += c;
          }
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

  void execute(const std::vector<runtime::ReadyTensor>& ready, Clock::time_point cycle_start,
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
      std::vector<const runtime::ReadyTensor*> members;
      std::vector<TensorView> tensors;
      for (std::size_t index : group.members) {
        members.push_back(&ready[index]);
        tensors.push_back(pending_.at(ready[index].name).tensor);
      }
      BufferRecord record = executor_.execute(group, members, tensors);
      {
        std::lock_guard lock(stats_mutex_);
        ++stats_.messages;
        stats_.input_bytes += record.input_bytes;
        stats_.wire_bytes += record.wire_bytes;
        stats_.staged_bytes += record.staged_bytes;
        stats_.copy_in_s += record.copy_in_s;
        stats_.compress_s += record.compress_s;
        stats_.communicate_s += record.communicate_s;
        stats_.decompress_s += record.decompress_s;
        stats_.copy_out_s += record.copy_out_s;
        stats_.buffers.push_back(std::move(record));
        if (stats_.buffers.size() > 1024) stats_.buffers.erase(stats_.buffers.begin());
      }
      for (const auto* member : members) {
        auto it = pending_.find(member->name);
        negotiator_.remove_pending(member->name);
        complete(it->second, Status{});
        pending_.erase(it);
      }
    }
  }

  std::chrono::milliseconds timeout_;
  std::atomic<std::size_t> fusion_threshold_;
  runtime::Timeline timeline_;
  runtime::Negotiator negotiator_;
  runtime::Executor executor_;

  mutable std::mutex mutex_;
  std::condition_variable wake_cv_, done_cv_;
  bool backing_off_ = false;  // (mutex_) the loop waits longer than a cycle: enqueue() must wake it
  std::deque<Request> queue_;
  std::set<std::string> active_names_;
  std::map<std::uint64_t, HandleState> handles_;
  std::uint64_t next_id_ = 0;
  std::uint64_t in_flight_ = 0;
  bool shutdown_requested_ = false;
  std::map<std::string, runtime::Executor::ResidualShape> loaded_;  // loaded residuals not yet submitted
  std::exception_ptr fatal_;

  std::mutex spec_mutex_;
  std::map<std::string, std::string> canonical_;
  std::mutex stats_mutex_;
  RuntimeStats stats_;
  std::mutex join_mutex_;
  std::thread thread_;

  std::map<std::string, Request> pending_;  // background thread only
};

Runtime::Runtime(Communicator& comm, RuntimeOptions options) : impl_(std::make_unique<Impl>(comm, std::move(options))) {}
Runtime::~Runtime() {
  try {
    impl_->shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradcomp: Runtime shutdown failed: %s\n", e.what());
  }
}

Handle Runtime::allreduce_async(std::string_view name, const TensorView& tensor, std::string_view spec) {
  return Handle{impl_->enqueue(name, tensor, spec, nullptr)};
}

void Runtime::allreduce_async(std::string_view name, const TensorView& tensor, std::string_view spec,
                              CompletionCallback on_done) {
  GRADCOMP_CHECK(static_cast<bool>(on_done), "allreduce_async('{}'): the completion callback is empty", name);
  impl_->enqueue(name, tensor, spec, std::move(on_done));
}

void Runtime::wait(Handle handle) { impl_->wait(handle); }
bool Runtime::poll(Handle handle) const { return impl_->poll(handle); }
void Runtime::synchronize() { impl_->synchronize(); }
void Runtime::shutdown() { impl_->shutdown(); }
RuntimeStats Runtime::stats() const { return impl_->stats(false); }
RuntimeStats Runtime::take_stats() { return impl_->stats(true); }
std::vector<float> Runtime::residual(std::string_view name) const { return impl_->residual(name); }
std::vector<std::byte> Runtime::save_state() const { return impl_->save_state(); }
void Runtime::load_state(std::span<const std::byte> state) { impl_->load_state(state); }
void Runtime::set_fusion_threshold(std::size_t bytes) { impl_->set_fusion_threshold(bytes); }
std::size_t Runtime::fusion_threshold() const { return impl_->fusion_threshold(); }
int Runtime::rank() const { return impl_->comm_.rank(); }
int Runtime::size() const { return impl_->comm_.size(); }
const RuntimeOptions& Runtime::options() const { return impl_->options_; }

}  // namespace gradcomp
