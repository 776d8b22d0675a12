#include "torch_communicator.h"

#include <fmt/format.h>

#include <nanobind/stl/string.h>

#include "borrowed_tensor.h"
#include "gradcomp/error.h"

namespace gradcomp::python {
namespace {

nb::object byte_view(std::span<const std::byte> bytes, Memory memory) {
  return borrowed_torch_tensor(bytes.data(), bytes.size(), DType::kU8, memory.device);
}

// The adapter's `device` attribute: None, or a CUDA torch.device whose memory its group takes.
std::optional<Device> adapter_device(const nb::object& adapter) {
  if (!nb::hasattr(adapter, "device")) return std::nullopt;
  const nb::object device = adapter.attr("device");
  if (device.is_none() || nb::cast<std::string>(device.attr("type")) != "cuda") return std::nullopt;
  const nb::object index = device.attr("index");
  return Device::cuda(index.is_none() ? 0 : nb::cast<int>(index));
}

nb::list int_list(std::span<const std::size_t> values) {
  nb::list out;
  for (std::size_t v : values) out.append(v);
  return out;
}

}  // namespace

TorchCommunicator::TorchCommunicator(nb::object adapter)
    : adapter_(std::move(adapter)),
      rank_(nb::cast<int>(adapter_.attr("rank"))),
      size_(nb::cast<int>(adapter_.attr("size"))),
      backend_("torch:" + nb::cast<std::string>(adapter_.attr("backend"))),
      device_(adapter_device(adapter_)),
      timeout_(static_cast<long long>(nb::cast<double>(adapter_.attr("timeout_s")) * 1000.0)) {}

TorchCommunicator::~TorchCommunicator() {
  if (!Py_IsInitialized()) {
    adapter_.release();  // the interpreter is gone: nothing left to release it into
    return;
  }
  nb::gil_scoped_acquire gil;
  adapter_.reset();
}

template <typename... Args>
nb::object TorchCommunicator::call(const char* method, Memory memory, Args&&... args) {
  try {
    const double timeout_s = static_cast<double>(timeout_.count()) / 1000.0;
    if (memory.is_host()) return adapter_.attr(method)(std::forward<Args>(args)..., timeout_s);
    return adapter_.attr(method)(std::forward<Args>(args)..., timeout_s,
                                 nb::arg("stream") = reinterpret_cast<std::uintptr_t>(memory.stream));
  } catch (nb::python_error& e) {
    const std::string message = fmt::format("torch communicator ({}), rank {} of {}: {}", backend_, rank_, size_,
                                            nb::str(e.value()).c_str());
    if (e.matches(PyExc_TimeoutError)) throw Timeout(message);
    if (e.matches(PyExc_ValueError)) throw InvalidArgument(message);
    throw CommError(message);
  }
}

void TorchCommunicator::allreduce(const TensorView& inout, ReduceOp op) {
  require_memory(Memory::of(inout), "allreduce");
  require_reduce(inout.dtype(), op);
  nb::gil_scoped_acquire gil;
  call("allreduce", Memory::of(inout), borrowed_torch_tensor(inout.data(), inout.numel(), inout.dtype(), inout.device()),
       std::string(reduce_op_name(op)));
}

void TorchCommunicator::allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) {
  require_memory(memory, "allgather");
  GRADCOMP_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size_),
                 "torch communicator allgather on rank {}: recv holds {} bytes, expected {} x {}", rank_, recv.size(),
                 size_, send.size());
  nb::gil_scoped_acquire gil;
  call("allgather", memory, byte_view(send, memory), byte_view(recv, memory));
}

void TorchCommunicator::allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                                   std::span<std::byte> recv, Memory memory) {
  require_memory(memory, "allgatherv");
  GRADCOMP_CHECK(recv_counts.size() == static_cast<std::size_t>(size_) &&
                     recv_counts[static_cast<std::size_t>(rank_)] == send.size(),
                 "torch communicator allgatherv on rank {}: {} counts for {} ranks, this rank sends {} bytes", rank_,
                 recv_counts.size(), size_, send.size());
  nb::gil_scoped_acquire gil;
  call("allgatherv", memory, byte_view(send, memory), int_list(recv_counts), byte_view(recv, memory));
}

void TorchCommunicator::alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                                  std::span<std::byte> recv, std::span<const std::size_t> recv_counts,
                                  Memory memory) {
  require_memory(memory, "alltoallv");
  GRADCOMP_CHECK(send_counts.size() == static_cast<std::size_t>(size_) &&
                     recv_counts.size() == static_cast<std::size_t>(size_),
                 "torch communicator alltoallv on rank {}: {} send and {} recv counts for {} ranks", rank_,
                 send_counts.size(), recv_counts.size(), size_);
  nb::gil_scoped_acquire gil;
  call("alltoallv", memory, byte_view(send, memory), int_list(send_counts), byte_view(recv, memory),
       int_list(recv_counts));
}

void TorchCommunicator::broadcast(std::span<std::byte> buffer, int root, Memory memory) {
  require_memory(memory, "broadcast");
  GRADCOMP_CHECK(root >= 0 && root < size_, "torch communicator broadcast on rank {}: root {} is not in [0, {})",
                 rank_, root, size_);
  nb::gil_scoped_acquire gil;
  call("broadcast", memory, byte_view(buffer, memory), root);
}

void TorchCommunicator::barrier() {
  nb::gil_scoped_acquire gil;
  call("barrier", Memory::host());
}

std::unique_ptr<Communicator> TorchCommunicator::split(int color, int key) {
  nb::gil_scoped_acquire gil;
  nb::object child = call("split", Memory::host(), color, key);
  if (child.is_none()) return nullptr;
  auto out = std::make_unique<TorchCommunicator>(std::move(child));
  out->set_timeout(timeout_);
  return out;
}

}  // namespace gradcomp::python
