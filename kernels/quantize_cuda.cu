#include "kernels/quantize_cuda.h"

#include <algorithm>
#include <cstring>

#include "kernels/bitpack_ops.cuh"
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_reduce.cuh"
#include "kernels/onebit_ops.cuh"
#include "kernels/qsgd_ops.cuh"
#include "kernels/wire_nan.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarpsPerBlock = kThreads / 32;
constexpr std::size_t kTile = 128;              // elements a warp handles per iteration (4 per lane)
constexpr std::size_t kWholeTensorChunk = 65536; // kernels::kParallelChunk: TernGrad bucket=0 partial statistics
constexpr float kFloatMax = 3.40282347e38f;
constexpr unsigned kFull = 0xFFFFFFFFu;

struct Stats {
  float max_abs;
  float sum_abs;
  float sum_sq;
  bool bad;
};

// The lane's 4 values of v = g (+ r) at i0 .. i0+3, zero past `end`; `gv` keeps g for the non-finite count.
__device__ __forceinline__ void load4(const float* g, const float* r, std::size_t i0, std::size_t end, bool vec,
                                      float (&v)[4], float (&gv)[4]) {
  if (vec && i0 + 4 <= end) {
    const float4 g4 = *reinterpret_cast<const float4*>(g + i0);
    gv[0] = g4.x, gv[1] = g4.y, gv[2] = g4.z, gv[3] = g4.w;
    if (r) {
      const float4 r4 = *reinterpret_cast<const float4*>(r + i0);
      v[0] = g4.x + r4.x, v[1] = g4.y + r4.y, v[2] = g4.z + r4.z, v[3] = g4.w + r4.w;
    } else {
      v[0] = gv[0], v[1] = gv[1], v[2] = gv[2], v[3] = gv[3];
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const std::size_t i = i0 + j;
    gv[j] = i < end ? g[i] : 0.0f;
    v[j] = i < end ? (r ? gv[j] + r[i] : gv[j]) : 0.0f;
  }
}

// Statistics of v over [b0, b1) in bucket_stats' exact order: CPU lane k (= i mod 8) sums its elements in index
// order; lanes 0..7 of the warp play those lanes, reading the tile staged in shared memory. Every lane returns the
// same result.
__device__ Stats warp_stats(const float* g, const float* r, std::size_t b0, std::size_t b1, bool vec, bool want_abs,
                            bool want_sq, float* tile, unsigned long long& grad_nonfinite) {
  const unsigned lane = threadIdx.x & 31u;
  float mx = 0.0f, s_abs = 0.0f, s_sq = 0.0f;
  bool bad = false;
  for (std::size_t base = b0; base < b1; base += kTile) {
    const std::size_t i0 = base + 4 * lane;
    float v[4], gv[4];
    load4(g, r, i0, b1, vec, v, gv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i0 + j < b1) {
        const float a = fabsf(v[j]);
        bad |= !(a <= kFloatMax);
        const float fa = a <= kFloatMax ? a : 0.0f;
        mx = mx > fa ? mx : fa;
        grad_nonfinite += !isfinite(gv[j]);
      }
      tile[4 * lane + j] = v[j];
    }
    __syncwarp();
    if (lane < 8) {
      const std::size_t limit = b1 - base < kTile ? b1 - base : kTile;
      for (std::size_t m = lane; m < limit; m += 8) {
        const float x = tile[m];
        if (want_abs) s_abs += fabsf(x);
        if (want_sq) s_sq += x * x;  // no FMA contraction: the library's CUDA code is built with --fmad=false
      }
    }
    __syncwarp();
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(kFull, mx, offset);
    mx = mx > other ? mx : other;
  }
  Stats stats;
  stats.max_abs = mx;
  stats.bad = __any_sync(kFull, bad) != 0;
  float la[8], lq[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    la[k] = __shfl_sync(kFull, s_abs, k);
    lq[k] = __shfl_sync(kFull, s_sq, k);
  }
  stats.sum_abs = ((la[0] + la[1]) + (la[2] + la[3])) + ((la[4] + la[5]) + (la[6] + la[7]));
  stats.sum_sq = ((lq[0] + lq[1]) + (lq[2] + lq[3])) + ((lq[4] + lq[5]) + (lq[6] + lq[7]));
  return stats;
}

// Sequential double sums for the rare bucket whose f32 sums overflow (the CPU's fallbacks), by one thread.
__device__ double serial_sum_double(const float* g, const float* r, std::size_t b0, std::size_t b1, bool squares) {
  double sum = 0.0;
  for (std::size_t i = b0; i < b1; ++i) {
    const double v = static_cast<double>(r ? g[i] + r[i] : g[i]);
    sum += squares ? v * v : fabs(v);
  }
  return sum;
}

// The bucket's (unscaled) scale, exactly as the CPU codec computes it. Lane 0 runs any double fallback; every lane
// returns the same value.
__device__ float bucket_scale(const QuantizeParams& p, const Stats& s, const float* g, const float* r,
                              std::size_t b0, std::size_t b1) {
  const std::size_t m = b1 - b0;
  const unsigned lane = threadIdx.x & 31u;
  float scale = 0.0f;
  switch (p.kind) {
    case QuantKind::kQsgdMax:
      scale = s.max_abs;
      break;
    case QuantKind::kQsgdL2: {
      scale = sqrtf(s.sum_sq);
      if (!isfinite(scale)) {
        float fallback = 0.0f;
        if (lane == 0) {
          const double norm = sqrt(serial_sum_double(g, r, b0, b1, true));
          fallback = norm > static_cast<double>(kFloatMax) ? kFloatMax : static_cast<float>(norm);
        }
        scale = __shfl_sync(kFull, fallback, 0);
      }
      scale = scale > s.max_abs ? scale : s.max_abs;
      break;
    }
    case QuantKind::kTernGrad: {
      float sigma = 0.0f;
      if (p.clip > 0.0f && m > 0) {
        sigma = static_cast<float>(sqrt(static_cast<double>(s.sum_sq) / static_cast<double>(m)));
        if (!isfinite(s.sum_sq)) sigma = kFloatMax;
      }
      scale = terngrad_scale(s.max_abs, sigma, p.clip);
      break;
    }
    case QuantKind::kOneBit: {
      if (isfinite(s.sum_abs)) {
        scale = s.sum_abs / static_cast<float>(m);
      } else {
        float fallback = 0.0f;
        if (lane == 0) {
          fallback = static_cast<float>(serial_sum_double(g, r, b0, b1, false) / static_cast<double>(m));
        }
        scale = __shfl_sync(kFull, fallback, 0);
      }
      break;
    }
  }
  return scale;
}

// Codes, residuals and packed bytes of [b0, b1) with `scale` (bad: the bucket held NaN/Inf -> codes 0 and the
// residual keeps the finite part of v).
__device__ void warp_quantize(const QuantizeParams& p, const float* g, const float* r, float* r_out,
                              std::uint8_t* packed, std::size_t b0, std::size_t b1, bool vec, float scale, bool bad) {
  const unsigned lane = threadIdx.x & 31u;
  const bool onebit = p.kind == QuantKind::kOneBit;
  const unsigned bits = p.bits;
  const std::uint32_t levels = onebit ? 1u : signmag_levels(bits);
  const float unit = signmag_unit(scale, levels);
  const float inverse = signmag_inverse_unit(scale, levels);
  for (std::size_t base = b0; base < b1; base += kTile) {
    const std::size_t i0 = base + 4 * lane;
    float v[4], gv[4];
    load4(g, r, i0, b1, vec, v, gv);
    std::uint32_t codes[4] = {0u, 0u, 0u, 0u};
    float nr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (i0 < b1) {
      // Element e's uniform is signmag_uniform(stream.bits(e / 2), e): the lane's 4 elements use draws i0/2 and
      // i0/2 + 1, lanes 0-1 or 2-3 of Philox block i0/8 (i0 is a multiple of 4).
      std::uint32_t draw_lo = 0, draw_hi = 0;
      if (!onebit && !bad) {
        const Philox4 block = p.stream.block(i0 >> 3);
        const bool upper = ((i0 >> 1) & 3u) != 0;
        draw_lo = upper ? block.v[2] : block.v[0];
        draw_hi = upper ? block.v[3] : block.v[1];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (bad) {
          nr[j] = isfinite(v[j]) ? v[j] : 0.0f;
        } else if (onebit) {
          codes[j] = onebit_encode(v[j]);
          nr[j] = v[j] - onebit_decode(codes[j], scale);
        } else {
          const float uniform = signmag_uniform(j < 2 ? draw_lo : draw_hi, i0 + j);
          codes[j] = signmag_quantize(v[j], inverse, levels, bits, uniform);
          nr[j] = v[j] - signmag_dequantize(codes[j], unit, bits);
        }
        if (i0 + j >= b1) codes[j] = 0u;
      }
      if (r) {
        if (vec && i0 + 4 <= b1) {
          *reinterpret_cast<float4*>(r_out + i0) = make_float4(nr[0], nr[1], nr[2], nr[3]);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (i0 + j < b1) r_out[i0 + j] = nr[j];
          }
        }
      }
    }
    // Pairs of lanes own groups of 8 codes: the even lane packs its 4 and its neighbour's 4.
    const std::uint32_t mine = codes[0] | (codes[1] << 8) | (codes[2] << 16) | (codes[3] << 24);
    const std::uint32_t next = __shfl_down_sync(kFull, mine, 1);
    if ((lane & 1u) == 0 && i0 < b1) {
      // pack8's word (code k at bits k*bits), built and stored by unrolled loops: no local-memory array.
      std::uint64_t word = 0;
#pragma unroll
      for (unsigned k = 0; k < 4; ++k) {
        word |= static_cast<std::uint64_t>((mine >> (8u * k)) & 0xFFu) << (k * bits);
        word |= static_cast<std::uint64_t>((next >> (8u * k)) & 0xFFu) << ((4u + k) * bits);
      }
      const std::size_t valid = b1 - i0 < 8 ? b1 - i0 : 8;
      const std::size_t count = static_cast<std::size_t>(packed_bytes(valid, bits));
      std::uint8_t* dst = packed + i0 / 8 * bits;
#pragma unroll
      for (unsigned b = 0; b < 8; ++b) {
        if (b < count) dst[b] = static_cast<std::uint8_t>(word >> (8u * b));
      }
    }
  }
}

// One warp per bucket: statistics, scale, codes. Also counts bad buckets into counters->spare.
__global__ void __launch_bounds__(kThreads) bucket_encode_kernel(QuantizeParams p, const float* g, const float* r,
                                                                 float* r_out, std::byte* scales,
                                                                 std::uint8_t* packed, std::size_t n, bool vec,
                                                                 DeviceCounters* counters) {
  __shared__ float tiles[kWarpsPerBlock][kTile];
  float* tile = tiles[threadIdx.x / 32];
  const std::size_t buckets = (n + p.bucket - 1) / p.bucket;
  const std::size_t warp = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32;
  const std::size_t warps = std::size_t{gridDim.x} * blockDim.x / 32;
  const bool want_abs = p.kind == QuantKind::kOneBit;
  const bool want_sq = p.kind == QuantKind::kQsgdL2 || p.kind == QuantKind::kTernGrad;
  unsigned long long grad_nonfinite = 0, bad_buckets = 0;
  for (std::size_t b = warp; b < buckets; b += warps) {
    const std::size_t b0 = b * p.bucket;
    const std::size_t b1 = b0 + p.bucket < n ? b0 + p.bucket : n;
    const Stats s = warp_stats(g, r, b0, b1, vec, want_abs, want_sq, tile, grad_nonfinite);
    const float scale = s.bad ? 0.0f : bucket_scale(p, s, g, r, b0, b1);
    warp_quantize(p, g, r, r_out, packed, b0, b1, vec, scale, s.bad);
    if ((threadIdx.x & 31u) == 0) {
      const float wire = s.bad ? __uint_as_float(kWireNanF32) : scale * p.prescale;
      memcpy(scales + b * sizeof(float), &wire, sizeof(float));
      bad_buckets += s.bad;
    }
  }
  warp_count(grad_nonfinite, &counters->nonfinite);
  warp_count(bad_buckets, &counters->spare);
}

// TernGrad bucket=0, phase 1: statistics of each 64K chunk (one warp per chunk).
__global__ void __launch_bounds__(kThreads) chunk_stats_kernel(const float* g, const float* r, std::size_t n, bool vec,
                                                               Stats* partial, DeviceCounters* counters) {
  __shared__ float tiles[kWarpsPerBlock][kTile];
  float* tile = tiles[threadIdx.x / 32];
  const std::size_t chunks = (n + kWholeTensorChunk - 1) / kWholeTensorChunk;
  const std::size_t warp = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32;
  const std::size_t warps = std::size_t{gridDim.x} * blockDim.x / 32;
  unsigned long long grad_nonfinite = 0;
  for (std::size_t c = warp; c < chunks; c += warps) {
    const std::size_t b0 = c * kWholeTensorChunk;
    const std::size_t b1 = b0 + kWholeTensorChunk < n ? b0 + kWholeTensorChunk : n;
    const Stats s = warp_stats(g, r, b0, b1, vec, false, true, tile, grad_nonfinite);
    if ((threadIdx.x & 31u) == 0) partial[c] = s;
  }
  warp_count(grad_nonfinite, &counters->nonfinite);
}

// Phase 2: combine the partials in chunk order (as the CPU does), the scale, the wire scale and the header flag.
// The chunk sums must be combined in chunk order (the CPU's float rounding), so one thread adds them; the block
// first stages kCombineStage chunks at a time in shared memory with coalesced loads, so the serial chain waits on
// shared memory instead of one global load per chunk (4096 chunks at 256M values).
constexpr unsigned kCombineThreads = 256;
constexpr std::size_t kCombineStage = 1024;
__global__ void __launch_bounds__(kCombineThreads) combine_chunks_kernel(QuantizeParams p, const Stats* partial,
                                                                         std::size_t chunks, std::size_t n,
                                                                         float* scale_out, std::byte* scales,
                                                                         std::uint16_t* header_flags,
                                                                         std::uint16_t nonfinite_flag) {
  __shared__ Stats staged[kCombineStage];
  Stats total{0.0f, 0.0f, 0.0f, false};
  for (std::size_t base = 0; base < chunks; base += kCombineStage) {
    const std::size_t count = chunks - base < kCombineStage ? chunks - base : kCombineStage;
    for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) staged[i] = partial[base + i];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (std::size_t c = 0; c < count; ++c) {
        total.max_abs = total.max_abs > staged[c].max_abs ? total.max_abs : staged[c].max_abs;
        total.sum_sq += staged[c].sum_sq;
        total.bad = total.bad || staged[c].bad;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  float sigma = 0.0f;
  if (p.clip > 0.0f && n > 0) {
    sigma = static_cast<float>(sqrt(static_cast<double>(total.sum_sq) / static_cast<double>(n)));
    if (!isfinite(total.sum_sq)) sigma = kFloatMax;
  }
  const float scale = terngrad_scale(total.max_abs, sigma, p.clip);
  scale_out[0] = scale;
  scale_out[1] = total.bad ? 1.0f : 0.0f;
  const float wire = total.bad ? __uint_as_float(kWireNanF32) : scale * p.prescale;
  memcpy(scales, &wire, sizeof(float));
  if (total.bad) *header_flags = static_cast<std::uint16_t>(*header_flags | nonfinite_flag);
}

// Phase 3: quantize 64K chunks in parallel with the one scale.
__global__ void __launch_bounds__(kThreads) chunk_quantize_kernel(QuantizeParams p, const float* g, const float* r,
                                                                  float* r_out, std::uint8_t* packed, std::size_t n,
                                                                  bool vec, const float* scale_in) {
  const std::size_t chunks = (n + kWholeTensorChunk - 1) / kWholeTensorChunk;
  const std::size_t warp = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32;
  const std::size_t warps = std::size_t{gridDim.x} * blockDim.x / 32;
  const float scale = scale_in[0];
  const bool bad = scale_in[1] != 0.0f;
  for (std::size_t c = warp; c < chunks; c += warps) {
    const std::size_t b0 = c * kWholeTensorChunk;
    const std::size_t b1 = b0 + kWholeTensorChunk < n ? b0 + kWholeTensorChunk : n;
    warp_quantize(p, g, r, r_out, packed, b0, b1, vec, bad ? 0.0f : scale, bad);
  }
}

__global__ void set_flag_kernel(std::uint16_t* header_flags, const DeviceCounters* counters, std::uint16_t flag) {
  if (counters->spare != 0) *header_flags = static_cast<std::uint16_t>(*header_flags | flag);
}

bool aligned16(const void* pointer) { return (reinterpret_cast<std::uintptr_t>(pointer) & 15u) == 0; }

}  // namespace

void launch_quantize_encode(const QuantizeParams& p, const float* grad, const float* residual, float* residual_out,
                            std::byte* scales, std::uint8_t* packed, std::size_t n, DeviceCounters* counters,
                            std::uint16_t* header_flags, std::uint16_t nonfinite_flag, void* workspace,
                            std::size_t& workspace_bytes, cudaStream_t stream) {
  const bool whole = p.bucket == 0;
  const std::size_t chunks = (n + kWholeTensorChunk - 1) / kWholeTensorChunk;
  const std::size_t needed = whole ? 256 + chunks * sizeof(Stats) : 0;
  if (workspace == nullptr) {
    workspace_bytes = needed;
    return;
  }
  if (n == 0) return;
  const bool vec = aligned16(grad) && (!residual || (aligned16(residual) && aligned16(residual_out)));
  if (!whole) {
    const std::size_t buckets = (n + p.bucket - 1) / p.bucket;
    const unsigned grid = grid_for(buckets * 32, kThreads, bucket_encode_kernel);
    bucket_encode_kernel<<<grid, kThreads, 0, stream>>>(p, grad, residual, residual_out, scales, packed, n, vec,
                                                        counters);
    GRADCOMP_CUDA_LAUNCH_CHECK();
    set_flag_kernel<<<1, 1, 0, stream>>>(header_flags, counters, nonfinite_flag);
    GRADCOMP_CUDA_LAUNCH_CHECK();
    return;
  }
  auto* scale = static_cast<float*>(workspace);  // [scale, bad]
  auto* partial = reinterpret_cast<Stats*>(static_cast<std::byte*>(workspace) + 256);
  // chunk_stats and chunk_quantize share the grid: the smaller resident count of the two.
  const unsigned blocks = std::min(grid_for(chunks * 32, kThreads, chunk_stats_kernel),
                                   grid_for(chunks * 32, kThreads, chunk_quantize_kernel));
  chunk_stats_kernel<<<blocks, kThreads, 0, stream>>>(grad, residual, n, vec, partial, counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  combine_chunks_kernel<<<1, kCombineThreads, 0, stream>>>(p, partial, chunks, n, scale, scales, header_flags,
                                                          nonfinite_flag);
  GRADCOMP_CUDA_LAUNCH_CHECK();
  chunk_quantize_kernel<<<blocks, kThreads, 0, stream>>>(p, grad, residual, residual_out, packed, n, vec, scale);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
