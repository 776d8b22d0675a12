#include "kernels/dense_cuda.h"

#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_reduce.cuh"
#include "kernels/dense_ops.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

bool aligned16(const void* pointer) { return (reinterpret_cast<std::uintptr_t>(pointer) & 15u) == 0; }

// Wire storage of four consecutive elements: one 16-byte store for f32, one 8-byte store for 16-bit wires.
template <DenseWire W>
struct WireTraits;
template <>
struct WireTraits<DenseWire::kF32> {
  using Element = float;
  __device__ static void store4(Element* out, std::size_t i, const Element (&w)[4]) {
    *reinterpret_cast<float4*>(out + i) = make_float4(w[0], w[1], w[2], w[3]);
  }
};
template <DenseWire W>
struct WireTraits {
  using Element = std::uint16_t;
  __device__ static void store4(Element* out, std::size_t i, const Element (&w)[4]) {
    *reinterpret_cast<uint2*>(out + i) = make_uint2(static_cast<unsigned>(w[0]) | (static_cast<unsigned>(w[1]) << 16),
                                                    static_cast<unsigned>(w[2]) | (static_cast<unsigned>(w[3]) << 16));
  }
};

template <DenseWire W>
__device__ __forceinline__ typename WireTraits<W>::Element encode_one(const DenseEncodeParams& p, float g,
                                                                        const float* residual, float* residual_out,
                                                                        std::size_t i, float r,
                                                                        unsigned long long& nonfinite,
                                                                        unsigned long long& saturated) {
  nonfinite += !isfinite(g);
  const DenseEncoded<typename WireTraits<W>::Element> e =
      dense_encode_element<W == DenseWire::kF32 ? 0 : (W == DenseWire::kF16 ? 1 : 2)>(g, r, residual != nullptr,
                                                                                       p.prescale);
  saturated += e.saturated;
  if (residual) residual_out[i] = e.residual;
  return e.wire;
}

// One fused pass: read grad (+ residual), write the wire value (+ new residual). Vec: 16-byte loads of 4 elements
// per thread per iteration (all pointers 16-byte aligned), the tail (< 4 elements) by thread 0 of block 0.
template <DenseWire W, bool Vec>
__global__ void __launch_bounds__(kThreads) dense_encode_kernel(DenseEncodeParams p, const float* __restrict__ grad,
                                                                const float* residual, float* residual_out,
                                                                typename WireTraits<W>::Element* __restrict__ out,
                                                                std::size_t n, DeviceCounters* counters) {
  using Element = typename WireTraits<W>::Element;
  unsigned long long nonfinite = 0, saturated = 0;
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t first = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if constexpr (Vec) {
    const std::size_t groups = n / 4;
    for (std::size_t q = first; q < groups; q += stride) {
      const float4 g4 = reinterpret_cast<const float4*>(grad)[q];
      const float4 r4 = residual ? reinterpret_cast<const float4*>(residual)[q] : make_float4(0, 0, 0, 0);
      const float gs[4] = {g4.x, g4.y, g4.z, g4.w};
      const float rs[4] = {r4.x, r4.y, r4.z, r4.w};
      Element w[4];
      float nr[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        nonfinite += !isfinite(gs[j]);
        const auto e = dense_encode_element<W == DenseWire::kF32 ? 0 : (W == DenseWire::kF16 ? 1 : 2)>(
            gs[j], rs[j], residual != nullptr, p.prescale);
        saturated += e.saturated;
        w[j] = e.wire;
        nr[j] = e.residual;
      }
      WireTraits<W>::store4(out, 4 * q, w);
      if (residual) reinterpret_cast<float4*>(residual_out)[q] = make_float4(nr[0], nr[1], nr[2], nr[3]);
    }
    if (first == 0) {
      for (std::size_t i = groups * 4; i < n; ++i) {
        out[i] = encode_one<W>(p, grad[i], residual, residual_out, i, residual ? residual[i] : 0.0f, nonfinite,
                               saturated);
      }
    }
  } else {
    for (std::size_t i = first; i < n; i += stride) {
      out[i] = encode_one<W>(p, grad[i], residual, residual_out, i, residual ? residual[i] : 0.0f, nonfinite,
                             saturated);
    }
  }
  warp_count(nonfinite, &counters->nonfinite);
  warp_count(saturated, &counters->saturated);
}

template <DenseWire W>
__global__ void __launch_bounds__(kThreads)
    dense_decode_kernel(const typename WireTraits<W>::Element* __restrict__ body, float* out, std::size_t n,
                        bool accumulate) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float value = dense_decode_element<W == DenseWire::kF32 ? 0 : (W == DenseWire::kF16 ? 1 : 2)>(body[i]);
    out[i] = accumulate ? out[i] + value : value;
  }
}

template <DenseWire W>
void encode_as(const DenseEncodeParams& p, const float* grad, const float* residual, float* residual_out, void* out,
               std::size_t n, DeviceCounters* counters, cudaStream_t stream) {
  using Element = typename WireTraits<W>::Element;
  auto* body = static_cast<Element*>(out);
  const bool vec = aligned16(grad) && aligned16(out) && (!residual || (aligned16(residual) && aligned16(residual_out)));
  if (vec) {
    const unsigned grid = grid_for(n / 4 + 1, kThreads, dense_encode_kernel<W, true>);
    dense_encode_kernel<W, true><<<grid, kThreads, 0, stream>>>(p, grad, residual, residual_out, body, n, counters);
  } else {
    const unsigned grid = grid_for(n, kThreads, dense_encode_kernel<W, false>);
    dense_encode_kernel<W, false><<<grid, kThreads, 0, stream>>>(p, grad, residual, residual_out, body, n, counters);
  }
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_dense_encode(const DenseEncodeParams& params, const float* grad, const float* residual,
                         float* residual_out, void* out, std::size_t n, DeviceCounters* counters, cudaStream_t stream) {
  if (n == 0) return;
  switch (params.wire) {
    case DenseWire::kF32:
      return encode_as<DenseWire::kF32>(params, grad, residual, residual_out, out, n, counters, stream);
    case DenseWire::kF16:
      return encode_as<DenseWire::kF16>(params, grad, residual, residual_out, out, n, counters, stream);
    case DenseWire::kBF16:
      return encode_as<DenseWire::kBF16>(params, grad, residual, residual_out, out, n, counters, stream);
  }
}

void launch_dense_decode(DenseWire wire, const void* body, float* out, std::size_t n, bool accumulate,
                         cudaStream_t stream) {
  if (n == 0) return;
  switch (wire) {
    case DenseWire::kF32:
      dense_decode_kernel<DenseWire::kF32>
          <<<grid_for(n, kThreads, dense_decode_kernel<DenseWire::kF32>), kThreads, 0, stream>>>(
              static_cast<const float*>(body), out, n, accumulate);
      break;
    case DenseWire::kF16:
      dense_decode_kernel<DenseWire::kF16>
          <<<grid_for(n, kThreads, dense_decode_kernel<DenseWire::kF16>), kThreads, 0, stream>>>(
              static_cast<const std::uint16_t*>(body), out, n, accumulate);
      break;
    case DenseWire::kBF16:
      dense_decode_kernel<DenseWire::kBF16>
          <<<grid_for(n, kThreads, dense_decode_kernel<DenseWire::kBF16>), kThreads, 0, stream>>>(
              static_cast<const std::uint16_t*>(body), out, n, accumulate);
      break;
  }
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
