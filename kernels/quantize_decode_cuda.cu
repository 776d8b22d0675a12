// The decode side of the bucket quantizers' CUDA path (kernels/quantize_cuda.h): the scale check run before any
// part is written, and the decode of packed codes (QSGD, TernGrad, 1-bit).
#include <cstring>

#include "kernels/bitpack_ops.cuh"
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/onebit_ops.cuh"
#include "kernels/qsgd_ops.cuh"
#include "kernels/quantize_cuda.h"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

__global__ void check_scales_kernel(const std::byte* scales, std::size_t count, bool allow_nan, int* error_flag) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float s;
    memcpy(&s, scales + i * sizeof(float), sizeof(float));
    const bool ok = (s >= 0.0f && isfinite(s)) || (allow_nan && isnan(s));
    if (!ok) atomicExch(error_flag, 1);  // any writer sets the same value: order does not matter
  }
}

// One thread per group of 8 codes (a group never straddles buckets: buckets are multiples of 8).
__global__ void __launch_bounds__(kThreads) quantize_decode_kernel(unsigned bits, bool onebit, std::size_t bucket,
                                                                   const std::byte* scales,
                                                                   const std::uint8_t* packed, float* out,
                                                                   std::size_t n, bool accumulate) {
  const std::size_t groups = (n + 7) / 8;
  const std::uint32_t levels = onebit ? 1u : signmag_levels(bits);
  for (std::size_t gi = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; gi < groups;
       gi += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i0 = gi * 8;
    float scale;
    memcpy(&scale, scales + (i0 / bucket) * sizeof(float), sizeof(float));
    const std::size_t valid = n - i0 < 8 ? n - i0 : 8;
    std::uint8_t bytes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const std::size_t count = static_cast<std::size_t>(packed_bytes(valid, bits));
    for (std::size_t b = 0; b < count; ++b) bytes[b] = packed[gi * bits + b];
    std::uint8_t codes[8];
    unpack8(bytes, bits, codes);
    const float unit = signmag_unit(scale, levels);
    for (std::size_t j = 0; j < valid; ++j) {
      const float value = onebit ? onebit_decode(codes[j], scale) : signmag_dequantize(codes[j], unit, bits);
      out[i0 + j] = accumulate ? out[i0 + j] + value : value;
    }
  }
}

}  // namespace

void launch_check_scales(const std::byte* scales, std::size_t count, bool allow_nan, int* error_flag,
                         cudaStream_t stream) {
  if (count == 0) return;
  const unsigned grid = grid_for(count, kThreads, check_scales_kernel);
  check_scales_kernel<<<grid, kThreads, 0, stream>>>(scales, count, allow_nan, error_flag);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_quantize_decode(unsigned bits, bool onebit, std::size_t bucket, const std::byte* scales,
                            const std::uint8_t* packed, float* out, std::size_t n, bool accumulate,
                            cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for((n + 7) / 8, kThreads, quantize_decode_kernel);
  quantize_decode_kernel<<<grid, kThreads, 0, stream>>>(bits, onebit, bucket, scales, packed, out, n, accumulate);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
