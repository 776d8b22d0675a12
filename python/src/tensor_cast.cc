#include "tensor_cast.h"

#include <fmt/format.h>

#include "gradcomp/error.h"

namespace gradcomp::python {
namespace {

DType dtype_of(nb::dlpack::dtype dt, std::string_view what) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (dt.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 32) return DType::kF32;
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 16) return DType::kF16;
    if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) return DType::kBF16;
    if (code == nb::dlpack::dtype_code::UInt && dt.bits == 8) return DType::kU8;
    if (code == nb::dlpack::dtype_code::Int && dt.bits == 32) return DType::kI32;
  }
  throw InvalidArgument(fmt::format("{}: unsupported element type (DLPack code {}, {} bits, {} lanes); gradcomp takes "
                                    "float32, float16 or bfloat16 tensors (and uint8 payloads)",
                                    what, static_cast<int>(dt.code), dt.bits, dt.lanes));
}

template <typename Array>
TensorView view_of(const Array& array, std::string_view what, std::uintptr_t stream) {
  const DType dtype = dtype_of(array.dtype(), what);
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
  return TensorView(data, array.size(), dtype, device, reinterpret_cast<void*>(stream));
}

}  // namespace

TensorView to_view(const nb::ndarray<nb::ro>& array, std::string_view what, std::uintptr_t stream) {
  return view_of(array, what, stream);
}
TensorView to_view(const nb::ndarray<>& array, std::string_view what, std::uintptr_t stream) {
  return view_of(array, what, stream);
}

}  // namespace gradcomp::python
