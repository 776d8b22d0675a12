#include "borrowed_tensor.h"

#include <fmt/format.h>

#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>

#include "gradcomp/error.h"

namespace gradcomp::python {
namespace {

// DLPack's DLManagedTensor (dlpack.h, ABI-stable), with the shape stored beside it.
struct ManagedTensor {
  nb::dlpack::dltensor tensor;
  void* manager_ctx = nullptr;
  void (*deleter)(ManagedTensor*) = nullptr;
  std::int64_t shape[1] = {0};
};

// Frees only the descriptor: the memory is the caller's. No Python API, so no GIL.
void delete_managed(ManagedTensor* managed) {
  delete managed;
}

// A capsule torch never consumed (from_dlpack failed) still owns its descriptor.
void delete_unconsumed_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    delete_managed(static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor")));
  }
}

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return nb::dtype<float>();
    case DType::kF16: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBF16: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::kI32: return nb::dtype<std::int32_t>();
    case DType::kU8: return nb::dtype<std::uint8_t>();
  }
  throw InvalidArgument(fmt::format("torch view: unsupported dtype {}", static_cast<int>(dtype)));
}

}  // namespace

nb::object borrowed_torch_tensor(const void* data, std::size_t numel, DType dtype, Device device) {
  alignas(16) static std::byte empty[16];  // torch needs a non-null pointer even for an empty view
  auto managed = std::make_unique<ManagedTensor>();
  managed->shape[0] = static_cast<std::int64_t>(numel);
  managed->tensor.data = numel > 0 ? const_cast<void*>(data) : static_cast<void*>(empty);
  managed->tensor.device = {device.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value,
                            device.is_cuda() ? device.index : 0};
  managed->tensor.ndim = 1;
  managed->tensor.dtype = dlpack_dtype(dtype);
  managed->tensor.shape = managed->shape;
  managed->tensor.strides = nullptr;  // compact
  managed->tensor.byte_offset = 0;
  managed->deleter = delete_managed;
  nb::object capsule = nb::steal(PyCapsule_New(managed.get(), "dltensor", delete_unconsumed_capsule));
  if (!capsule.is_valid()) throw nb::python_error();
  managed.release();  // the capsule owns it now; torch takes it over in from_dlpack
  // Kept for the process's life on purpose: a static nb::object would be released after the interpreter is gone.
  static const nb::handle from_dlpack =
      nb::object(nb::module_::import_("torch.utils.dlpack").attr("from_dlpack")).release();
  return from_dlpack(capsule);
}

}  // namespace gradcomp::python
