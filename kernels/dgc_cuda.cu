// DGC's CUDA kernels (Lin et al. 2018; compressors/codecs/dgc.cc is the CPU reference, matched bit for bit): the local
// clipping norm, the momentum-corrected accumulation and the stratified sample of the threshold. Declared in
// kernels/sparse_cuda.h with the other sparsifiers' launchers; the selection itself is sparse_cuda.cu's radix select.
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_reduce.cuh"
#include "kernels/sparse_cuda.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp::kernels {
namespace {

constexpr unsigned kThreads = 256;

__global__ void dgc_chunk_norm_kernel(const float* grad, std::size_t n, double* partial) {
  const std::size_t chunks = (n + 65535) / 65536;
  for (std::size_t c = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; c < chunks;
       c += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t begin = c * 65536, end = begin + 65536 < n ? begin + 65536 : n;
    double sum = 0.0;
    for (std::size_t i = begin; i < end; ++i) sum += double(grad[i]) * grad[i];  // no FMA: --fmad=false
    partial[c] = sum;
  }
}

// The chunk sums are added in chunk order by one thread (the CPU's rounding); the block stages them in shared memory
// with coalesced loads first, so the chain does not wait on one global load per chunk.
constexpr unsigned kClipThreads = 256;
constexpr std::size_t kClipStage = 2048;
__global__ void __launch_bounds__(kClipThreads) dgc_clip_scale_kernel(const double* partial, std::size_t chunks,
                                                                      double clip, float* scale_out) {
  __shared__ double staged[kClipStage];
  double sum = 0.0;
  for (std::size_t base = 0; base < chunks; base += kClipStage) {
    const std::size_t count = chunks - base < kClipStage ? chunks - base : kClipStage;
    for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) staged[i] = partial[base + i];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (std::size_t c = 0; c < count; ++c) sum += staged[c];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const double norm = sqrt(sum);
  *scale_out = norm > clip ? static_cast<float>(clip / norm) : 1.0f;
}

__global__ void dgc_accumulate_kernel(const float* grad, const float* scale, const float* u, const float* v,
                                      float* u_out, float* v_out, std::size_t n, float momentum, bool nesterov,
                                      DeviceCounters* counters) {
  const float s = scale ? *scale : 1.0f;
  unsigned long long nonfinite = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    nonfinite += !isfinite(g);
    float ui = u[i], vi = v[i];
    dgc_accumulate(s == 1.0f ? g : g * s, momentum, nesterov, ui, vi);
    u_out[i] = ui;
    v_out[i] = vi;
  }
  warp_count(nonfinite, &counters->nonfinite);
}

__global__ void dgc_sample_kernel(const float* v, std::size_t n, PhiloxStream stream, std::size_t full_draws,
                                  std::size_t samples, float* keys) {
  for (std::size_t s = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; s < samples;
       s += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t c = s / full_draws, j = s % full_draws;
    const std::size_t begin = c * 65536;
    const std::size_t length = n - begin < 65536 ? n - begin : 65536;
    const std::uint64_t offset = uniform_below32(stream.bits(begin + j), length);
    keys[s] = __uint_as_float(magnitude_key(v[begin + offset]));
  }
}

}  // namespace

void launch_dgc_clip_scale(const float* grad, std::size_t n, double clip, double* partial, float* scale_out,
                           cudaStream_t stream) {
  const std::size_t chunks = (n + 65535) / 65536;
  if (chunks > 0) {
    const unsigned grid = grid_for(chunks, 64, dgc_chunk_norm_kernel);
    dgc_chunk_norm_kernel<<<grid, 64, 0, stream>>>(grad, n, partial);
    GRADCOMP_CUDA_LAUNCH_CHECK();
  }
  dgc_clip_scale_kernel<<<1, kClipThreads, 0, stream>>>(partial, chunks, clip, scale_out);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_dgc_accumulate(const float* grad, const float* scale, const float* u, const float* v, float* u_out,
                           float* v_out, std::size_t n, float momentum, bool nesterov, DeviceCounters* counters,
                           cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, dgc_accumulate_kernel);
  dgc_accumulate_kernel<<<grid, kThreads, 0, stream>>>(grad, scale, u, v, u_out, v_out, n, momentum, nesterov,
                                                       counters);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

void launch_dgc_sample(const float* v, std::size_t n, const PhiloxStream& stream, std::size_t full_draws,
                       std::size_t samples, float* keys, cudaStream_t stream_cuda) {
  if (samples == 0 || full_draws == 0) return;
  const unsigned grid = grid_for(samples, kThreads, dgc_sample_kernel);
  dgc_sample_kernel<<<grid, kThreads, 0, stream_cuda>>>(v, n, stream, full_draws, samples, keys);
  GRADCOMP_CUDA_LAUNCH_CHECK();
}

}  // namespace gradcomp::kernels
