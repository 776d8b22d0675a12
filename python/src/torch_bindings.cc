// Python bindings of the torch.distributed bridge: TorchCommunicator and ExchangeWorker (see their headers).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include "bindings.h"

#include "exchange_worker.h"
#include "torch_communicator.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gradcomp::python {

void init_torch(nb::module_& m) {
  nb::class_<TorchCommunicator, Communicator>(
      m, "TorchCommunicator",
      "A Communicator over a torch.distributed process group, through a gradcomp.torch.exchange.ProcessGroupAdapter.")
      .def(nb::init<nb::object>(), "adapter"_a)
      .def_prop_ro("adapter", &TorchCommunicator::adapter);
  nb::class_<ExchangeWorker>(m, "ExchangeWorker",
                             "One thread per process group running compressed allreduces in submission order.")
      .def(nb::init<nb::object, nb::object>(), "communicator"_a, "device_enter"_a = nb::none())
      .def("submit", &ExchangeWorker::submit, "compressor"_a, "tensor"_a, "name"_a, "op"_a = "average",
           "step"_a = 0, "algorithm"_a = "auto", "segments"_a = nb::none(), "hierarchical"_a = false,
           "result"_a = nb::none(),
           "stats"_a = nb::none(), "verify"_a = true, "agreement"_a = nb::none(), "stream"_a = 0,
           "Enqueues an in-place compressed allreduce; returns a torch.futures.Future whose value is `result`.")
      .def("submit_call", &ExchangeWorker::submit_call, "fn"_a, "agreement"_a = nb::none(),
           "Enqueues a Python callable (run with the GIL, in order); returns a torch.futures.Future of its result.")
      .def("close", &ExchangeWorker::close, "Finishes the queued jobs and ends the thread.");
}

}  // namespace gradcomp::python
