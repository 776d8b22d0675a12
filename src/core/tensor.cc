#include "gradcomp/tensor.h"

#include <fmt/format.h>

#include "gradcomp/error.h"

namespace gradcomp {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  throw InvalidArgument(fmt::format("unknown dtype code {}", static_cast<int>(dtype)));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "f16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "u8" || name == "uint8") return DType::kU8;
  throw InvalidArgument(fmt::format("unknown dtype '{}' (valid: f32, f16, bf16, i32, u8)", name));
}

std::string device_name(Device device) {
  return device.is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", device.index);
}

TensorView::TensorView(void* data, std::size_t numel, DType dtype, Device device, void* stream)
    : data_(data), numel_(numel), dtype_(dtype), device_(device), stream_(stream) {
  (void)dtype_size(dtype);
  GRADCOMP_CHECK(data != nullptr || numel == 0, "TensorView of {} elements has a null data pointer", numel);
  GRADCOMP_CHECK(device.is_cuda() || stream == nullptr, "a CPU TensorView cannot carry a CUDA stream");
  GRADCOMP_CHECK(device.index >= 0, "TensorView device index must be >= 0, got {}", device.index);
}

TensorView TensorView::slice(std::size_t offset, std::size_t count) const {
  GRADCOMP_CHECK(offset <= numel_ && count <= numel_ - offset, "slice [{}, {}) is out of range of {}", offset,
                 offset + count, describe());
  return TensorView(count == 0 ? data_ : static_cast<char*>(data_) + offset * dtype_size(dtype_), count, dtype_,
                    device_, stream_);
}

TensorView TensorView::with_rows(std::size_t rows) const {
  GRADCOMP_CHECK(rows == 0 || numel_ % rows == 0, "{} cannot be viewed as a matrix of {} rows ({} is not a multiple)",
                 describe(), rows, numel_);
  TensorView view = *this;
  view.rows_ = rows;
  return view;
}

void TensorView::expect(DType dtype, std::size_t numel, std::string_view what) const {
  GRADCOMP_CHECK(dtype_ == dtype && numel_ == numel, "{} must be {}[{}], got {}", what, dtype_name(dtype), numel,
                 describe());
}

std::string TensorView::describe() const {
  return fmt::format("{}[{}] on {}", dtype_name(dtype_), numel_, device_name(device_));
}

namespace detail {
void throw_dtype_mismatch(DType have, DType want) {
  throw InvalidArgument(fmt::format("tensor has dtype {}, accessed as {}", dtype_name(have), dtype_name(want)));
}
}  // namespace detail

}  // namespace gradcomp
