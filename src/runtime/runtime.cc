#include "gradcomp/runtime.h"

#include <fmt/format.h>

#include <cstdio>

#include "gradcomp/config.h"
#include "gradcomp/registry.h"
#include "kernels/cuda_device.h"
#include "gradcomp/error.h"
#include "src/runtime/policy.h"
#include "src/runtime/runtime_impl.h"

namespace gradcomp {

using runtime::Clock;

Runtime::Impl::Impl(Communicator& comm, RuntimeOptions options)
    : comm_(comm),
      options_(std::move(options)),
      timeout_(options_.timeout.count() > 0 ? options_.timeout : comm.timeout()),
      fusion_threshold_(options_.fusion_threshold_bytes),
      negotiator_(comm.rank(), comm.size(), options_.cache_capacity),
      executor_(comm, options_, open_timeline(comm)) {
  GRADCOMP_CHECK(options_.cycle_time_ms >= 0, "cycle_time_ms must be >= 0, got {}", options_.cycle_time_ms);
  GRADCOMP_CHECK(options_.idle_cycle_max_ms >= 0, "idle_cycle_max_ms must be >= 0, got {}",
                 options_.idle_cycle_max_ms);
  GRADCOMP_CHECK(options_.pipeline_lanes >= 0 && options_.pipeline_lanes <= 16,
                 "pipeline_lanes must be in [0, 16], got {}", options_.pipeline_lanes);
  for (const auto& rule : options_.policy.rules) canonical(rule.spec);
  canonical(options_.policy.default_spec.empty() ? "none" : options_.policy.default_spec);
  for (const auto& spec : options_.policy.auto_candidates) canonical(spec);
  thread_ = std::thread([this] { loop(); });
}

std::uint64_t Runtime::Impl::enqueue(std::string_view user_name, const TensorView& tensor,
                                     const SubmitOptions& submit, CompletionCallback callback) {
  GRADCOMP_CHECK(!user_name.empty(), "allreduce_async on rank {}: the tensor name must not be empty", comm_.rank());
  GRADCOMP_CHECK(submit.compressor == nullptr || !submit.scope.empty(),
                 "allreduce_async('{}') on rank {}: a caller's compressor needs a scope (SubmitOptions::scope)",
                 user_name, comm_.rank());
  const std::string key =
      submit.scope.empty() ? std::string(user_name) : fmt::format("[{}]{}", submit.scope, user_name);
  const std::string_view name = key;
  const ReduceOp reduce = submit.op.value_or(options_.op);
  GRADCOMP_CHECK(reduce == ReduceOp::kSum || reduce == ReduceOp::kAverage,
                 "allreduce_async('{}') on rank {}: op must be sum or average, got {}", name, comm_.rank(),
                 reduce_op_name(reduce));
  if (tensor.device().is_cuda() && options_.device_comm != nullptr) {
    GRADCOMP_CHECK(options_.device_comm->size() == comm_.size() && options_.device_comm->rank() == comm_.rank(),
                   "allreduce_async('{}') on rank {}: RuntimeOptions::device_comm is rank {} of {}, the runtime's "
                   "communicator rank {} of {}",
                   name, comm_.rank(), options_.device_comm->rank(), options_.device_comm->size(), comm_.rank(),
                   comm_.size());
  }
  std::string resolved = submit.compressor != nullptr ? submit.compressor->spec()
                         : submit.spec.empty()        ? runtime::resolve_spec(options_.policy, user_name, tensor.bytes())
                                                      : std::string(submit.spec);
  Request request;
  request.name = key;
  request.user_name = std::string(user_name);
  request.tensor = tensor;
  request.compressor = submit.compressor;
  request.step = submit.step.value_or(kStepOfCall);
  request.signature = {tensor.numel(), tensor.dtype(), tensor.device(),
                       submit.compressor != nullptr ? resolved : canonical(resolved), reduce,
                       std::string(submit.scope), tensor.rows()};
  check_servable(name, tensor, request.signature.spec, submit.compressor);
  request.callback = std::move(callback);
  request.enqueued = Clock::now();
  std::lock_guard lock(mutex_);
  if (fatal_) std::rethrow_exception(fatal_);
  GRADCOMP_CHECK(!shutdown_requested_, "allreduce_async('{}') on rank {}: the runtime is shut down", name,
                 comm_.rank());
  if (submit.compressor != nullptr) {
    const auto [it, fresh] = scopes_.emplace(std::string(submit.scope), submit.compressor);
    GRADCOMP_CHECK(fresh || it->second == submit.compressor,
                   "allreduce_async('{}') on rank {}: scope '{}' already submits with another compressor (one "
                   "compressor per scope)",
                   user_name, comm_.rank(), submit.scope);
  }
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
  // The first tensor of a burst wakes a backed-off loop (under mutex_: it cannot miss it); the loop checks the queue
  // before it sleeps again, so the rest of the burst need not (a wake-up is a system call per tensor).
  if (backing_off_ && queue_.size() == 1) wake_cv_.notify_one();
  return id;
}

void Runtime::Impl::wait(Handle handle) {
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

bool Runtime::Impl::poll(Handle handle) const {
  std::lock_guard lock(mutex_);
  auto it = handles_.find(handle.id);
  GRADCOMP_CHECK(it != handles_.end(), "poll on rank {}: unknown or already waited handle {}", comm_.rank(),
                 handle.id);
  return it->second.done;
}

void Runtime::Impl::synchronize() {
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

void Runtime::Impl::shutdown() {
  {
    std::lock_guard lock(mutex_);
    shutdown_requested_ = true;
  }
  wake_cv_.notify_all();
  std::lock_guard join_lock(join_mutex_);
  if (thread_.joinable()) thread_.join();
  timeline_.close();
}

RuntimeStats Runtime::Impl::stats(bool reset) {
  std::lock_guard lock(stats_mutex_);
  RuntimeStats out = stats_;
  if (reset) {
    stats_ = RuntimeStats{};
    buffer_seqs_.clear();
  }
  return out;
}

// Holding mutex_ keeps new work from starting (enqueue and the cycle's queue swap both take it); with nothing in
// flight the background thread cannot be inside the executor, so its state may be read or replaced here.
void Runtime::Impl::require_idle(const char* what) const {
  if (fatal_) std::rethrow_exception(fatal_);
  GRADCOMP_CHECK(in_flight_ == 0 && queue_.empty(),
                 "{} on rank {}: {} tensor(s) still pending; call synchronize() first", what, comm_.rank(),
                 in_flight_);
}

runtime::Timeline* Runtime::Impl::open_timeline(Communicator& comm) {
  if (!options_.timeline_path.empty()) start_timeline(options_.timeline_path, comm.rank());
  return &timeline_;  // events are dropped while it is closed
}

void Runtime::Impl::start_timeline(const std::string& path_pattern, int rank) {
  GRADCOMP_CHECK(!path_pattern.empty(), "start_timeline: the path must not be empty (rank {})", rank);
  std::string path = path_pattern;
  const auto at = path.find("{rank}");
  if (at != std::string::npos) path.replace(at, 6, std::to_string(rank));
  timeline_.close();
  if (at == std::string::npos && rank != 0) return;  // one file: rank 0 writes it
  timeline_.open(path, rank);
}

void Runtime::Impl::check_servable(std::string_view name, const TensorView& tensor, const std::string& spec,
                                   Compressor* owned) {
  if (tensor.device().is_cuda()) {
    const int devices = cuda_device_count();
    GRADCOMP_CHECK(devices > tensor.device().index && tensor.device().index >= 0,
                   "allreduce_async('{}') on rank {}: {} is a CUDA tensor but {} (the runtime keeps serving other "
                   "tensors)",
                   name, comm_.rank(), tensor.describe(),
                   devices == 0 ? cuda_unavailable_reason()
                                : fmt::format("this process sees {} CUDA device(s)", devices));
  }
  GRADCOMP_CHECK(tensor.dtype() == DType::kF32 || tensor.dtype() == DType::kF16 || tensor.dtype() == DType::kBF16,
                 "allreduce_async('{}') on rank {}: the tensor must be f32, f16 or bf16, got {}", name, comm_.rank(),
                 tensor.describe());
  if (spec == runtime::kAutoSpec) return;
  try {
    if (owned != nullptr) {
      (void)owned->max_payload_bytes(tensor.numel());
      return;
    }
    std::lock_guard lock(spec_mutex_);
    auto& probe = probes_[spec];
    if (!probe) probe = make_compressor(spec);
    (void)probe->max_payload_bytes(tensor.numel());
  } catch (const InvalidArgument& error) {
    throw InvalidArgument(fmt::format("allreduce_async('{}') on rank {}: {}", name, comm_.rank(), error.what()));
  }
}

std::string Runtime::Impl::canonical(const std::string& spec) {
  std::lock_guard lock(spec_mutex_);
  auto it = canonical_.find(spec);
  if (it != canonical_.end()) return it->second;
  std::string value = runtime::canonical_spec(spec);
  canonical_.emplace(spec, value);
  return value;
}

void Runtime::Impl::complete(Request& request, const Status& status, bool notify) {
  complete_requests(std::span<Request>(&request, 1), status);
  if (notify) done_cv_.notify_all();
}

void Runtime::Impl::complete_requests(std::span<Request> requests, const Status& status) {
  // A buffer's tensors complete together: the counter and the handles under one lock each (the caller's thread
  // takes mutex_ for every enqueue), the callbacks outside any lock, in_flight_ once they all ran.
  {
    std::lock_guard lock(stats_mutex_);
    stats_.tensors += requests.size();
  }
  {
    std::lock_guard lock(mutex_);
    for (Request& request : requests) {
      active_names_.erase(request.name);
      if (!request.callback) handles_[request.id] = HandleState{true, status};
    }
  }
  for (Request& request : requests) {
    if (!request.callback) continue;
    const CompletionCallback callback = std::move(request.callback);
    try {
      callback(status);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradcomp: completion callback of '%s' threw: %s\n", request.name.c_str(), e.what());
    } catch (...) {
      std::fprintf(stderr, "gradcomp: completion callback of '%s' threw\n", request.name.c_str());
    }
  }
  std::lock_guard lock(mutex_);
  in_flight_ -= requests.size();
}

void Runtime::Impl::fail_pending(const Status& status) {
  for (auto& [name, request] : pending_) complete(request, status);
  pending_.clear();
}

Runtime::Runtime(Communicator& comm, RuntimeOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(options))) {}
Runtime::~Runtime() {
  try {
    impl_->shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradcomp: Runtime shutdown failed: %s\n", e.what());
  }
}

Handle Runtime::allreduce_async(std::string_view name, const TensorView& tensor, std::string_view spec,
                               std::optional<ReduceOp> op) {
  return Handle{impl_->enqueue(name, tensor, SubmitOptions{.spec = spec, .op = op}, nullptr)};
}

void Runtime::allreduce_async(std::string_view name, const TensorView& tensor, std::string_view spec,
                              CompletionCallback on_done, std::optional<ReduceOp> op) {
  allreduce_async(name, tensor, SubmitOptions{.spec = spec, .op = op}, std::move(on_done));
}

Handle Runtime::allreduce_async(std::string_view name, const TensorView& tensor, const SubmitOptions& submit) {
  return Handle{impl_->enqueue(name, tensor, submit, nullptr)};
}

void Runtime::allreduce_async(std::string_view name, const TensorView& tensor, const SubmitOptions& submit,
                              CompletionCallback on_done) {
  GRADCOMP_CHECK(static_cast<bool>(on_done), "allreduce_async('{}'): the completion callback is empty", name);
  impl_->enqueue(name, tensor, submit, std::move(on_done));
}

void Runtime::wait(Handle handle) { impl_->wait(handle); }
bool Runtime::poll(Handle handle) const { return impl_->poll(handle); }
void Runtime::synchronize() { impl_->synchronize(); }
int Runtime::join() { return impl_->join(); }
void Runtime::start_timeline(const std::string& path) { impl_->start_timeline(path, impl_->rank()); }
void Runtime::stop_timeline() { impl_->stop_timeline(); }
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
