#include "tensor_cast.h"

#include <fmt/format.h>

#include <string>

#include "gradcomp/error.h"

namespace gradcomp::python {
namespace {

constexpr std::string_view kAccepted =
    "gradcomp takes contiguous float32, float16 or bfloat16 tensors or NumPy arrays (uint8 for payloads)";

// str(object), throwing python_error on failure.
std::string text_of(nb::handle object) {
  const nb::object text = nb::steal(PyObject_Str(object.ptr()));
  const char* utf8 = text.is_valid() ? PyUnicode_AsUTF8(text.ptr()) : nullptr;
  if (utf8 == nullptr) throw nb::python_error();
  return utf8;
}

// What `object` is, for error messages: its type and dtype (torch.bool, numpy's bool), or just its type.
std::string describe_object(nb::handle object) {
  PyErr_Clear();  // a failed import can leave the exporter's exception set (torch 1.13 cannot export bool tensors)
  try {
    const std::string type = text_of(object.type().attr("__qualname__"));
    if (!nb::hasattr(object, "dtype")) return fmt::format("a {}", type);
    return fmt::format("a {} of dtype {}", type, text_of(object.attr("dtype")));
  } catch (nb::python_error&) {
    PyErr_Clear();
    return "an object that cannot be described";
  }
}

DType dtype_of(nb::dlpack::dtype dt, nb::handle object, std::string_view what) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (dt.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 32) return DType::kF32;
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 16) return DType::kF16;
    if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) return DType::kBF16;
    if (code == nb::dlpack::dtype_code::UInt && dt.bits == 8) return DType::kU8;
    if (code == nb::dlpack::dtype_code::Int && dt.bits == 32) return DType::kI32;
  }
  throw InvalidArgument(fmt::format("{}: unsupported element type: {} (DLPack code {}, {} bits, {} lanes); {}", what,
                                    describe_object(object), static_cast<int>(dt.code), dt.bits, dt.lanes, kAccepted));
}

template <typename Array>
Array import_array(nb::handle object, std::string_view what) {
  Array array;
  if (!nb::try_cast(object, array, /*convert=*/false)) {
    throw InvalidArgument(fmt::format("{}: unsupported element type or object: {}; {}", what, describe_object(object),
                                      kAccepted));
  }
  return array;
}

template <typename Array>
TensorView view_of(const Array& array, nb::handle object, std::string_view what, std::uintptr_t stream) {
  const DType dtype = dtype_of(array.dtype(), object, what);
  // C-contiguity, ignoring the strides of size-1 dimensions (torch reports arbitrary ones there).
  std::int64_t expected = 1;
  for (std::size_t d = array.ndim(); d-- > 0;) {
    if (array.shape(d) != 1 && array.stride(d) != expected) {
      throw InvalidArgument(fmt::format("{}: the array is not contiguous (dimension {} has stride {}, expected {}); "
                                        "call .contiguous() first",
                                        what, d, array.stride(d), expected));
    }
    expected *= static_cast<std::int64_t>(array.shape(d));
  }
  Device device;
  const int type = array.device_type();
  if (type == nb::device::cpu::value) {
    device = Device::cpu();
    stream = 0;
  } else if (type == nb::device::cuda::value) {
    device = Device::cuda(array.device_id());
  } else {
    throw InvalidArgument(fmt::format("{}: unsupported device (DLPack device type {}); gradcomp takes CPU and CUDA "
                                      "tensors", what, type));
  }
  void* data = const_cast<void*>(static_cast<const void*>(array.data()));
  // A tensor of two or more dimensions is also a matrix of its first dimension's rows (shape-aware codecs).
  const std::size_t rows = array.ndim() >= 2 ? static_cast<std::size_t>(array.shape(0)) : 0;
  return TensorView(data, array.size(), dtype, device, reinterpret_cast<void*>(stream)).with_rows(rows);
}

}  // namespace

TensorView to_view(const InArray& array, std::string_view what, std::uintptr_t stream) {
  return view_of(import_array<nb::ndarray<nb::ro>>(array.object, what), array.object, what, stream);
}
TensorView to_view(const OutArray& array, std::string_view what, std::uintptr_t stream) {
  return view_of(import_array<nb::ndarray<>>(array.object, what), array.object, what, stream);
}

}  // namespace gradcomp::python
