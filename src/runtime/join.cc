// Horovod's join as a negotiated response: a joined rank's negotiation message carries a flag (negotiator.h), the
// others' tensors run without it submitting them, and it takes part with zeros of the negotiated signature.
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "src/runtime/runtime_impl.h"

namespace gradcomp {

int Runtime::Impl::join() {
  std::unique_lock lock(mutex_);
  if (fatal_) std::rethrow_exception(fatal_);
  GRADCOMP_CHECK(!shutdown_requested_, "join on rank {}: the runtime is shut down", comm_.rank());
  GRADCOMP_CHECK(!join_requested_, "join on rank {}: join() is already running on this rank", comm_.rank());
  join_requested_ = true;
  join_result_.reset();
  backing_off_ = false;
  wake_cv_.notify_all();  // the flag must reach the next cycle's message
  // The others decide when they run out of data: no deadline here, but a stopped runtime ends the wait.
  done_cv_.wait(lock, [&] { return join_result_.has_value() || fatal_ != nullptr || shutdown_requested_; });
  join_requested_ = false;
  if (join_result_) return *join_result_;
  if (fatal_) std::rethrow_exception(fatal_);
  throw Error(fmt::format("join on rank {}: the runtime shut down before every rank joined", comm_.rank()));
}

void Runtime::Impl::finish_join(int last_joined) {
  {
    std::lock_guard lock(mutex_);
    join_requested_ = false;  // the next message no longer carries the flag, on every rank at the same cycle
    join_result_ = last_joined;
  }
  done_cv_.notify_all();
}

void Runtime::Impl::add_join_zeros(const std::vector<runtime::ReadyTensor>& ready) {
  for (const auto& tensor : ready) {
    if (pending_.count(tensor.name) != 0) continue;
    const runtime::Signature& signature = tensor.signature;
    auto zeros = std::make_shared<std::vector<std::byte>>(signature.numel * dtype_size(signature.dtype));
    Request request;
    request.name = tensor.name;
    request.user_name = tensor.name;
    if (!signature.scope.empty()) {
      request.user_name = tensor.name.substr(signature.scope.size() + 2);  // "[scope]name"
      std::lock_guard lock(mutex_);
      auto it = scopes_.find(signature.scope);
      if (it != scopes_.end()) request.compressor = it->second;
    }
    request.tensor = TensorView(zeros->data(), signature.numel, signature.dtype, Device::cpu())
                         .with_rows(static_cast<std::size_t>(signature.rows));
    request.signature = signature;
    request.signature.device = Device::cpu();
    // The callback owns the zeros until the request completes (on a pipeline lane, after this cycle).
    request.callback = [zeros](const Status&) {};
    request.enqueued = runtime::Clock::now();
    {
      std::lock_guard lock(mutex_);
      ++in_flight_;
      request.id = ++next_id_;
    }
    pending_.emplace(tensor.name, std::move(request));
  }
}

}  // namespace gradcomp
