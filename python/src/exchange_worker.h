// The thread that runs a process group's compressed allreduces off the caller's thread (DDP's autograd thread, the
// optimizer's gradient hooks), one at a time in submission order, completing a torch.futures.Future for each. The
// collectives of one job are therefore never interleaved with another job's, every rank issues them in the same
// order, and backward keeps computing while a bucket travels (the thread holds the GIL only inside the torch
// communicator's calls and to complete the future).
//
// A CUDA tensor's job runs on the tensor's device (a DeviceScope around it: the worker thread never chose a device,
// and without it every CUDA call of the job, and torch's current device, would be GPU 0's) and on the stream that
// produced it (the submitter passes torch's current stream for the tensor's device), so the job's copies and kernels
// are ordered after the backward kernels that wrote the gradient.
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"

namespace gradcomp::python {

namespace nb = nanobind;

class ExchangeWorker {
 public:
  // `communicator`: the Python object of a Communicator (a TorchCommunicator); the worker keeps it alive.
  // `device_enter`: None, or (a test seam, for machines without a GPU) a callable(device_index, stream) the worker
  // thread calls with the GIL at the start of each CUDA job instead of making the device current. Needs the GIL.
  explicit ExchangeWorker(nb::object communicator, nb::object device_enter = nb::none());
  // close().
  ~ExchangeWorker();
  ExchangeWorker(const ExchangeWorker&) = delete;
  ExchangeWorker& operator=(const ExchangeWorker&) = delete;

  // Enqueues compressed_allreduce(comm, compressor, tensor, name, {op, step, algorithm, segments, hierarchical,
  // verify}) on the tensor in place. `segments`: None or [(name, offset, numel[, rows])] covering the tensor in order.
  // `hierarchical`: the node groups are built by the first such job (a collective split, in job order on every rank)
  // and reused by the later ones for the worker's lifetime. `verify`: compressed_allreduce's own per-call agreement
  // check. `agreement`: None, or (scope, description) of the exchange's layout (ExchangeLayout, agreement.h): checked
  // across ranks before the job's first collective, until a check of that (scope, description) has passed; later jobs of the layout skip it (the decision is taken in job order, so every
  // rank takes the same one). Returns a torch.futures.Future whose value is
  // `result` once the tensor holds the aggregate, or that carries the gradcomp exception (with rank and tensor name).
  // When `stats` is a dict, the AllreduceStats are written into it before the future completes. The worker holds
  // references to the compressor and the tensor until then. Arguments are checked here (raising in the caller). The
  // compressor must not be used by another thread while its jobs are pending. `stream`: for a CUDA tensor the
  // cudaStream_t (as an integer) that produced it, torch.cuda.current_stream(tensor.device).cuda_stream at submit
  // time; 0 is the device's legacy default stream.
  nb::object submit(nb::object compressor, nb::object tensor, std::string name, std::string_view op,
                    std::uint64_t step, std::string_view algorithm, nb::handle segments, bool hierarchical,
                    nb::object result, nb::object stats, bool verify, nb::handle agreement, std::uintptr_t stream);
  // Enqueues a Python callable, run with the GIL in order with the other jobs (the fallback for Python codecs); the
  // future's value is its return value, or its exception. `agreement` as for submit(), checked before `fn` runs.
  nb::object submit_call(nb::object fn, nb::handle agreement);
  // Runs the jobs already queued, then ends the thread. Later submits raise CommError. Idempotent.
  void close();

 private:
  struct Job;
  nb::object enqueue(std::unique_ptr<Job> job);
  void loop();
  void run(Job& job);
  void run_allreduce(Job& job);
  static void finish(std::unique_ptr<Job> job);

  nb::object communicator_owner_;
  nb::object device_enter_;  // test seam (see the constructor); None in production
  Communicator* communicator_ = nullptr;
  nb::object future_type_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::unique_ptr<NodeGroups> nodes_;  // used by the worker thread only
  std::set<std::pair<std::uint64_t, std::array<std::byte, 16>>> agreed_;  // layouts checked; worker thread only
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace gradcomp::python
