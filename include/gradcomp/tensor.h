// Non-owning views of gradient memory on a CPU or CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace gradcomp {

// Element type of a tensor or payload section.
enum class DType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kU8 = 4 };

// Size of one element of `dtype` in bytes.
std::size_t dtype_size(DType dtype);
// Lower-case name: "f32", "f16", "bf16", "i32", "u8".
std::string_view dtype_name(DType dtype);
// Parses a name produced by dtype_name (also accepts "float32", "float16", "bfloat16", "int32", "uint8").
// Throws InvalidArgument listing the valid names.
DType parse_dtype(std::string_view name);

enum class DeviceType : std::uint8_t { kCPU = 0, kCUDA = 1 };

// Where memory lives. `index` is the CUDA ordinal (ignored, and 0, for the CPU).
struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int ordinal) { return {DeviceType::kCUDA, ordinal}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu" or "cuda:N".
std::string device_name(Device device);

// Makes a CUDA `device` the calling thread's current device for the scope's lifetime and restores the previous one
// afterwards (CUDA calls without a device argument, and PyTorch's current device, follow it). A CPU device changes
// nothing. gradcomp's entry points open one for a CUDA tensor, so a thread that never chose a device (a worker, a
// framework's background thread) neither works on the wrong GPU nor creates a context on GPU 0. Throws CudaError when
// the device cannot be made current, InvalidArgument for a CUDA device in a build without CUDA.
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  [[maybe_unused]] int previous_ = -1;  // the device to restore, or -1 when nothing changed (unused without CUDA)
};

// A non-owning view of `numel` contiguous elements of `dtype` at `data` on `device`. The caller owns the memory and
// keeps it alive while any gradcomp call uses the view. `stream` is a cudaStream_t (nullptr = default stream) for
// CUDA tensors and must be nullptr for CPU tensors.
class TensorView {
 public:
  TensorView() = default;
  // Throws InvalidArgument if data is null while numel > 0, or a CPU view carries a stream.
  TensorView(void* data, std::size_t numel, DType dtype, Device device = Device::cpu(), void* stream = nullptr);

  // Convenience constructors for host spans.
  static TensorView of(std::span<float> values) { return {values.data(), values.size(), DType::kF32}; }
  static TensorView of(std::span<const float> values) {
    return {const_cast<float*>(values.data()), values.size(), DType::kF32};
  }

  void* data() const { return data_; }
  std::size_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  void* stream() const { return stream_; }
  std::size_t bytes() const { return numel_ * dtype_size(dtype_); }
  bool empty() const { return numel_ == 0; }

  // Typed pointer; throws InvalidArgument if T does not match dtype() (checked by element size and kind).
  template <typename T>
  T* data_as() const;

  // The sub-view [offset, offset + count) (a vector: rows() 0). Throws InvalidArgument when out of range.
  TensorView slice(std::size_t offset, std::size_t count) const;

  // The first dimension of the tensor this views when it has two or more (rows x numel/rows, the matrix a
  // shape-aware codec such as PowerSGD compresses); 0 for a vector (the default).
  std::size_t rows() const { return rows_; }
  // This view with rows() = `rows`. Throws InvalidArgument unless rows is 0 or divides numel().
  TensorView with_rows(std::size_t rows) const;

  // Throws InvalidArgument naming `what` unless this view has `dtype` and `numel` elements.
  void expect(DType dtype, std::size_t numel, std::string_view what) const;

  // "f32[1000] on cpu".
  std::string describe() const;

 private:
  void* data_ = nullptr;
  std::size_t numel_ = 0;
  DType dtype_ = DType::kF32;
  Device device_{};
  void* stream_ = nullptr;
  std::size_t rows_ = 0;
};

// Where the buffers of one communicator or codec call live: host memory, or memory of a CUDA device whose contents
// are ready once the work queued on `stream` (a cudaStream_t; nullptr = the device's default stream) has run. The
// caller says it; nothing probes a pointer.
struct Memory {
  Device device = Device::cpu();
  void* stream = nullptr;

  static Memory host() { return {}; }
  static Memory on(Device device, void* stream) { return {device, stream}; }
  // Where `view`'s elements live (its device and stream).
  static Memory of(const TensorView& view) { return {view.device(), view.stream()}; }
  bool is_host() const { return device.is_cpu(); }
};

namespace detail {
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::kU8;
};
[[noreturn]] void throw_dtype_mismatch(DType have, DType want);
}  // namespace detail

template <typename T>
T* TensorView::data_as() const {
  using Bare = std::remove_const_t<T>;
  if constexpr (requires { detail::DTypeOf<Bare>::value; }) {
    if (dtype_ != detail::DTypeOf<Bare>::value) detail::throw_dtype_mismatch(dtype_, detail::DTypeOf<Bare>::value);
  } else {
    static_assert(sizeof(Bare) == 2, "data_as<T>: T must be float, int32_t, uint8_t or a 16-bit type");
    if (dtype_ != DType::kF16 && dtype_ != DType::kBF16) detail::throw_dtype_mismatch(dtype_, DType::kF16);
  }
  return static_cast<T*>(data_);
}

}  // namespace gradcomp
