// The decode side of the bucket quantizers' CUDA path (kernels/quantize_cuda.h): the scale check run before any
// part is written, and the decode of packed codes (QSGD, TernGrad, 1-bit).
#include <cstdint>
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

// One thread per group of 8 codes (a group never straddles buckets: buckets are multiples of 8). Every loop is
// unrolled over constant bounds, so the group's word, codes and values stay in registers (a runtime-indexed array
// lands in local memory: the first device profile measured this kernel at 9% of DRAM bandwidth); a whole group is
// written as two 16-byte stores when `out` is 16-byte aligned.
__global__ void __launch_bounds__(kThreads) quantize_decode_kernel(unsigned bits, bool onebit, std::size_t bucket,
                                                                   const std::byte* scales,
                                                                   const std::uint8_t* packed, float* out,
                                                                   std::size_t n, bool accumulate) {
  const std::size_t groups = (n + 7) / 8;
  const std::uint32_t levels = onebit ? 1u : signmag_levels(bits);
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1u;
  const bool vector_out = (reinterpret_cast<std::uintptr_t>(out) & 15u) == 0;
  for (std::size_t gi = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; gi < groups;
       gi += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i0 = gi * 8;
    float scale;
    memcpy(&scale, scales + (i0 / bucket) * sizeof(float), sizeof(float));
    const std::size_t valid = n - i0 < 8 ? n - i0 : 8;
    const std::size_t count = static_cast<std::size_t>(packed_bytes(valid, bits));
    const std::uint8_t* in = packed + gi * bits;
    std::uint64_t word = 0;  // unpack8's word: byte b at bits 8b .. 8b+7
#pragma unroll
    for (unsigned b = 0; b < 8; ++b) {
      if (b < count) word |= static_cast<std::uint64_t>(in[b]) << (8u * b);
    }
    const float unit = signmag_unit(scale, levels);
    float value[8];
#pragma unroll
    for (unsigned j = 0; j < 8; ++j) {
      const auto code = static_cast<std::uint32_t>((word >> (j * bits)) & mask);
      value[j] = onebit ? onebit_decode(code, scale) : signmag_dequantize(code, unit, bits);
    }
    if (valid == 8 && vector_out) {
      auto* out4 = reinterpret_cast<float4*>(out + i0);
      float4 lo = make_float4(value[0], value[1], value[2], value[3]);
      float4 hi = make_float4(value[4], value[5], value[6], value[7]);
      if (accumulate) {
        const float4 a = out4[0], b = out4[1];
        lo = make_float4(a.x + lo.x, a.y + lo.y, a.z + lo.z, a.w + lo.w);
        hi = make_float4(b.x + hi.x, b.y + hi.y, b.z + hi.z, b.w + hi.w);
      }
      out4[0] = lo;
      out4[1] = hi;
    } else {
#pragma unroll
      for (unsigned j = 0; j < 8; ++j) {
        if (j < valid) out[i0 + j] = accumulate ? out[i0 + j] + value[j] : value[j];
      }
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
