#include "comm/host_reduce.h"

#include <cstdint>

#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"

namespace gradcomp::comm {
namespace {

template <typename T>
void combine(T* acc, const T* in, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + in[i]);
      break;
    case ReduceOp::kMax:
      for (std::size_t i = 0; i < n; ++i) acc[i] = in[i] > acc[i] ? in[i] : acc[i];
      break;
    case ReduceOp::kMin:
      for (std::size_t i = 0; i < n; ++i) acc[i] = in[i] < acc[i] ? in[i] : acc[i];
      break;
  }
}

template <typename ToFloat, typename FromFloat>
void combine_half(std::uint16_t* acc, const std::uint16_t* in, std::size_t n, ToFloat to_float, FromFloat from_float) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = from_float(to_float(acc[i]) + to_float(in[i]));
}

}  // namespace

void reduce_into(void* acc, const void* in, std::size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32: combine(static_cast<float*>(acc), static_cast<const float*>(in), n, op); return;
    case DType::kI32:
      combine(static_cast<std::int32_t*>(acc), static_cast<const std::int32_t*>(in), n, op);
      return;
    case DType::kU8:
      combine(static_cast<std::uint8_t*>(acc), static_cast<const std::uint8_t*>(in), n, op);
      return;
    case DType::kF16:
      combine_half(static_cast<std::uint16_t*>(acc), static_cast<const std::uint16_t*>(in), n,
                   kernels::half_bits_to_float, kernels::float_to_half_bits);
      return;
    case DType::kBF16:
      combine_half(static_cast<std::uint16_t*>(acc), static_cast<const std::uint16_t*>(in), n,
                   kernels::bf16_bits_to_float, kernels::float_to_bf16_bits);
      return;
  }
}

void divide_by(void* data, std::size_t n, DType dtype, int divisor) {
  const float d = static_cast<float>(divisor);
  if (dtype == DType::kF32) {
    auto* values = static_cast<float*>(data);
    for (std::size_t i = 0; i < n; ++i) values[i] /= d;
  } else if (dtype == DType::kF16) {
    auto* bits = static_cast<std::uint16_t*>(data);
    for (std::size_t i = 0; i < n; ++i) bits[i] = kernels::float_to_half_bits(kernels::half_bits_to_float(bits[i]) / d);
  } else if (dtype == DType::kBF16) {
    auto* bits = static_cast<std::uint16_t*>(data);
    for (std::size_t i = 0; i < n; ++i) bits[i] = kernels::float_to_bf16_bits(kernels::bf16_bits_to_float(bits[i]) / d);
  }
}

}  // namespace gradcomp::comm
