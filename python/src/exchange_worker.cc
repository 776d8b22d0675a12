#include "exchange_worker.h"

#include <fmt/format.h>
#include <pthread.h>

#include <nanobind/ndarray.h>

#include <optional>

#include "agreement.h"
#include "allreduce_args.h"
#include "bindings.h"
#include "gradcomp/collectives.h"
#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "tensor_cast.h"

namespace gradcomp::python {

struct ExchangeWorker::Job {
  // Python references: created and dropped with the GIL held.
  nb::object future, result, stats, tensor_owner, compressor_owner, fn;
  nb::object fn_value;             // what fn returned
  nb::object python_error;         // the exception fn raised
  std::exception_ptr error;        // what compressed_allreduce threw
  Compressor* compressor = nullptr;
  TensorView tensor;
  std::string name;
  AllreduceOptions options;
  std::unique_ptr<OwnedSegments> segments;
  std::optional<ExchangeLayout> layout;  // checked across ranks before the job's first collective
  AllreduceStats done;
};

namespace {

// None, or the (scope, description) pair of ExchangeWorker::submit.
std::optional<ExchangeLayout> layout_of(nb::handle agreement) {
  if (agreement.is_none()) return std::nullopt;
  nb::tuple pair;
  nb::str description;
  ExchangeLayout layout;
  if (!nb::try_cast(agreement, pair) || pair.size() != 2 || !nb::try_cast(pair[0], layout.scope) ||
      !nb::try_cast(pair[1], description)) {
    throw InvalidArgument("exchange worker: agreement must be None or (scope, description)");
  }
  layout.description = description.c_str();
  layout.fingerprint = agreement_fingerprint(layout.description);
  return layout;
}

}  // namespace

ExchangeWorker::ExchangeWorker(nb::object communicator, nb::object device_enter)
    : communicator_owner_(std::move(communicator)),
      device_enter_(std::move(device_enter)),
      communicator_(nb::cast<Communicator*>(communicator_owner_)),
      future_type_(nb::module_::import_("torch.futures").attr("Future")) {
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), "gradcomp-xchg");
}

ExchangeWorker::~ExchangeWorker() {
  close();
}

nb::object ExchangeWorker::submit(nb::object compressor, nb::object tensor, std::string name, std::string_view op,
                                  std::uint64_t step, std::string_view algorithm, nb::handle segments,
                                  bool hierarchical, nb::object result, nb::object stats, bool verify,
                                  nb::handle agreement, std::uintptr_t stream) {
  auto job = std::make_unique<Job>();
  job->layout = layout_of(agreement);
  job->compressor = nb::cast<Compressor*>(compressor);
  job->compressor_owner = std::move(compressor);
  const std::string what = fmt::format("compressed allreduce of '{}' on rank {}", name, communicator_->rank());
  job->tensor = to_view(OutArray{tensor}, what, stream);
  job->tensor_owner = std::move(tensor);
  job->segments = std::make_unique<OwnedSegments>(segments, job->tensor.numel(), what);
  job->name = std::move(name);
  job->options.op = op_of(op);
  job->options.step = step;
  job->options.algorithm = parse_algorithm(algorithm);
  job->options.segments = job->segments->view();
  job->options.hierarchical = hierarchical;
  job->options.verify = verify;
  job->result = std::move(result);
  job->stats = std::move(stats);
  return enqueue(std::move(job));
}

nb::object ExchangeWorker::submit_call(nb::object fn, nb::handle agreement) {
  auto job = std::make_unique<Job>();
  job->layout = layout_of(agreement);
  job->fn = std::move(fn);
  return enqueue(std::move(job));
}

nb::object ExchangeWorker::enqueue(std::unique_ptr<Job> job) {
  nb::object future = future_type_();
  job->future = future;
  {
    std::lock_guard lock(mutex_);
    if (closing_) {
      throw CommError(fmt::format("gradcomp exchange worker of rank {} is closed (interpreter exit or close())",
                                  communicator_->rank()));
    }
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return future;
}

void ExchangeWorker::close() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_one();
  if (!thread_.joinable()) return;
  if (PyGILState_Check()) {
    nb::gil_scoped_release release;  // the queued jobs need the GIL to finish
    thread_.join();
  } else {
    thread_.join();
  }
}

void ExchangeWorker::loop() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) break;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    run(*job);
    finish(std::move(job));
  }
  nodes_.reset();  // here, while close() has released the GIL: the node communicators take it to release theirs
}

void ExchangeWorker::run(Job& job) {
  if (job.layout) {
    // Decided in job order, which is the same on every rank: a layout is checked until a check has passed.
    const auto key = std::make_pair(job.layout->scope, job.layout->fingerprint);
    if (!agreed_.contains(key)) {
      try {
        check_agreement(*communicator_, *job.layout);
      } catch (...) {
        job.error = std::current_exception();
        return;
      }
      agreed_.insert(key);
    }
  }
  if (job.fn.is_valid()) {
    nb::gil_scoped_acquire gil;
    try {
      job.fn_value = job.fn();
    } catch (nb::python_error& e) {
      job.python_error = nb::borrow(e.value());
    }
    return;
  }
  try {
    run_allreduce(job);
  } catch (...) {
    job.error = std::current_exception();
  }
}

void ExchangeWorker::run_allreduce(Job& job) {
  // On the tensor's device for the whole job: the node groups' split, the torch communicator's calls (torch's current
  // device is CUDA's) and the allreduce itself.
  std::optional<DeviceScope> device;
  if (job.tensor.device().is_cuda() && device_enter_.is_valid() && !device_enter_.is_none()) {
    nb::gil_scoped_acquire gil;
    device_enter_(job.tensor.device().index, reinterpret_cast<std::uintptr_t>(job.tensor.stream()));
  } else {
    device.emplace(job.tensor.device());
  }
  if (job.options.hierarchical) {
    if (nodes_ == nullptr) nodes_ = std::make_unique<NodeGroups>(make_node_groups(*communicator_));
    job.options.nodes = nodes_.get();
  }
  job.done = compressed_allreduce(*communicator_, *job.compressor, job.tensor, job.name, job.options);
}

void ExchangeWorker::finish(std::unique_ptr<Job> job) {
  nb::gil_scoped_acquire gil;
  try {
    if (job->python_error.is_valid()) {
      job->future.attr("set_exception")(job->python_error);
    } else if (job->error) {
      job->future.attr("set_exception")(python_exception(job->error));
    } else if (job->fn.is_valid()) {
      job->future.attr("set_result")(job->fn_value);
    } else {
      if (job->stats.is_valid() && nb::isinstance<nb::dict>(job->stats)) {
        fill_stats(nb::borrow<nb::dict>(job->stats), job->done);
      }
      job->future.attr("set_result")(job->result);
    }
  } catch (nb::python_error& e) {
    e.discard_as_unraisable("gradcomp exchange worker: completing a future");
  }
  job.reset();  // drops the Python references while the GIL is held
}

}  // namespace gradcomp::python
