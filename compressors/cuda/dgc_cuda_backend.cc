// CUDA backend of dgc: clipping factor and momentum correction on the device (the CPU's orders of summation), the
// sampled threshold (same Philox sample positions, the sample's exact k-th key by the radix select), the candidate
// count (one sync), and the CPU's three paths (compressors/codecs/dgc.cc).
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "compressors/cuda/cuda_codec.h"
#include "compressors/codecs/dgc.h"
#include "compressors/cuda/sparse_cuda_backend.h"
#include "compressors/framework/sparse_checks.h"
#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cuda_check.h"
#include "kernels/sparse_cuda.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp {
namespace {


using sparse::index_value_header;

// dgc: clipping factor and momentum correction on the device (the CPU's orders of summation), the sampled threshold
// (same Philox sample positions, the sample's exact k-th key by the radix select), the candidate count (one sync),
// and the CPU's three paths: accept the candidates, or fall back to the exact top-k (which is also what the CPU's
// "refine among candidates" path yields: with more than k candidates at or above T, the k best are all candidates).
class DgcCudaCodec final : public CudaCodec {
 public:
  DgcCudaCodec(double ratio, float momentum, bool nesterov, double clip, std::uint64_t warmup, double sample)
      : ratio_(ratio), momentum_(momentum), nesterov_(nesterov), clip_(clip), warmup_(warmup), sample_(sample) {}

  std::size_t workspace_bytes(std::size_t n) const override { return layout(n).total; }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("dgc", args.ctx->name, n);
    TensorState& state = *args.state;
    const Layout l = layout(n);
    auto* base = static_cast<std::byte*>(args.workspace);
    void* select_ws = base + l.select;
    auto* candidates = reinterpret_cast<std::int32_t*>(base + l.candidates);
    auto* sample_keys = reinterpret_cast<float*>(base + l.samples);
    auto* partial = reinterpret_cast<double*>(base + l.partial);
    auto* clip_scale = reinterpret_cast<float*>(base + l.scale);
    auto* scratch_counters = reinterpret_cast<kernels::DeviceCounters*>(base + l.counters);
    auto* v_scratch = reinterpret_cast<float*>(base + l.v_scratch);
    // Counters of the selects and the masking gather (never read) must not be uninitialized memory (initcheck).
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(scratch_counters, 0, sizeof(kernels::DeviceCounters), args.stream));

    // The non-finite "skip" path has no residual: the CPU accumulates into zeros then.
    const float* v_in = args.buffers[0];
    float* v = args.next[0];
    if (v_in == nullptr) {
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(v_scratch, 0, std::max<std::size_t>(n, 1) * sizeof(float), args.stream));
      v_in = v_scratch;
      v = v_scratch;
    }
    const float* scale = nullptr;
    if (clip_ > 0.0 && n > 0) {
      kernels::launch_dgc_clip_scale(args.grad, n, clip_, partial, clip_scale, args.stream);
      scale = clip_scale;
    }
    kernels::launch_dgc_accumulate(args.grad, scale, args.buffers[1], v_in, args.next[1], v, n, momentum_, nesterov_,
                                   args.counters, args.stream);

    const double density = kernels::dgc_density(args.ctx->step, warmup_, ratio_);
    const std::size_t k = kernels::k_of_ratio(density, n);
    state.scalars.assign(kDgcScalarCount, 0.0);
    state.scalars[kDgcTargetK] = static_cast<double>(k);
    const std::size_t selected =
        select(args, v, k, Selection{select_ws, candidates, sample_keys, scratch_counters}, state);
    const payload::Header header =
        index_value_header(payload::CodecId::kDgc, n, args.original_dtype, selected, sparse::ValueType::kF32);
    write_header_device(header, out, args.stream);
    auto* indices = reinterpret_cast<std::int32_t*>(out + payload::section_offset(header, 0));
    if (selected > 0) {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(indices, candidates, selected * sizeof(std::int32_t),
                                          cudaMemcpyDeviceToDevice, args.stream));
    }
    // Momentum-factor masking: what was sent leaves the accumulator (v - transmitted) and the momentum (0).
    kernels::launch_sparse_gather(v, indices, selected, args.ctx->prescale, false,
                                  out + payload::section_offset(header, 1), v, scratch_counters, args.stream);
    kernels::launch_zero_at(indices, selected, args.next[1], args.stream);
    stats.selected = selected;
    return payload::total_bytes(header);
  }

  bool validate(const CudaDecodeArgs& args) override {
    sparse::check_dgc_value_type(args.view->header);
    return validate_index_value_cuda(args, "dgc");
  }
  void checked(const CudaDecodeArgs& args, int flag, std::uint64_t) const override {
    checked_index_value_cuda(args, flag, "dgc");
  }
  void decode(const CudaDecodeArgs& args) override { decode_index_value_cuda(args); }

 private:
  // Workspace of the selection.
  struct Selection {
    void* select;
    std::int32_t* candidates;
    float* sample_keys;
    kernels::DeviceCounters* counters;
  };

  // The k entries of v to send (compressors/codecs/dgc.cc's selection: a sampled threshold, exact when the sample is too
  // small or its count is off by more than the tolerance) into w.candidates; returns their count and records the
  // diagnostics scalars.
  std::size_t select(const CudaEncodeArgs& args, float* v, std::size_t k, const Selection& w,
                     TensorState& state) const {
    const std::size_t n = args.numel;
    state.scalars.assign(kDgcScalarCount, 0.0);
    state.scalars[kDgcTargetK] = static_cast<double>(k);
    auto exact = [&](double path) {
      const auto threshold = kernels::topk_threshold(v, nullptr, v, n, k, w.select, w.counters, args.stream);
      kernels::topk_compact(v, n, threshold, w.candidates, w.select, args.stream);
      state.scalars[kDgcPath] = path;
      return k;
    };
    if (n == 0) {
      state.scalars[kDgcPath] = 2;
      return 0;
    }
    // compressors/codecs/dgc.cc: ceil(sample * length) draws per 64K chunk; sampled only when k < n and enough draws.
    const std::size_t chunk = 65536;
    const std::size_t full_draws = draws_for(chunk);
    const std::size_t chunks = (n + chunk - 1) / chunk;
    const std::size_t samples = (chunks - 1) * full_draws + draws_for(n - (chunks - 1) * chunk);
    if (!(k < n && samples >= kMinSample)) return exact(2);
    const auto stream =
        kernels::PhiloxStream::make(0, args.tensor_key ^ kernels::kDgcSampleStreamSalt, args.ctx->step);
    kernels::launch_dgc_sample(v, n, stream, full_draws, samples, w.sample_keys, args.stream);
    const double scaled = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
    const std::size_t sample_k = std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(scaled)), 1, samples);
    const auto sampled = kernels::topk_threshold(w.sample_keys, nullptr, w.sample_keys, samples, sample_k, w.select,
                                                 w.counters, args.stream);
    const std::size_t count = kernels::collect_at_least(v, n, sampled.key, w.candidates, w.select, args.stream);
    float threshold_value;
    std::memcpy(&threshold_value, &sampled.key, sizeof(threshold_value));
    state.scalars[kDgcThreshold] = threshold_value;
    state.scalars[kDgcSampledCount] = static_cast<double>(count);
    if (static_cast<double>(count) > (1.0 + kTolerance) * static_cast<double>(k)) return exact(1);
    if (static_cast<double>(count) < (1.0 - kTolerance) * static_cast<double>(k)) return exact(2);
    state.scalars[kDgcPath] = 0;
    return count;
  }

  static constexpr std::size_t kMinSample = 1024;  // compressors/codecs/dgc.cc
  static constexpr double kTolerance = 0.3;        // compressors/codecs/dgc.cc

  struct Layout {
    std::size_t select, candidates, samples, partial, scale, counters, v_scratch, total;
  };
  static std::size_t up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::size_t draws_for(std::size_t length) const {
    return static_cast<std::size_t>(std::ceil(sample_ * static_cast<double>(length)));
  }
  // Upper bound of the sample size (the draws of ceil(n / 64K) chunks).
  std::size_t sample_count(std::size_t n) const { return ((n + 65535) / 65536) * draws_for(65536); }
  Layout layout(std::size_t n) const {
    const std::size_t m = std::max<std::size_t>(n, 1);
    Layout l{};
    std::size_t at = 0;
    l.select = at, at += up(kernels::topk_workspace_bytes(m));
    l.candidates = at, at += up(m * sizeof(std::int32_t));
    l.samples = at, at += up(std::max<std::size_t>(sample_count(m), 1) * sizeof(float));
    l.partial = at, at += up(((m + 65535) / 65536) * sizeof(double));
    l.scale = at, at += 256;
    l.counters = at, at += 256;
    l.v_scratch = at, at += up(m * sizeof(float));
    l.total = at;
    return l;
  }

  double ratio_;
  float momentum_;
  bool nesterov_;
  double clip_;
  std::uint64_t warmup_;
  double sample_;
};

}  // namespace

std::unique_ptr<CudaCodec> make_dgc_cuda_codec(const Params& params) {
  return std::make_unique<DgcCudaCodec>(
      params.get_float("ratio"), static_cast<float>(params.get_float("momentum")), params.get_bool("nesterov"),
      params.get_float("clip"), static_cast<std::uint64_t>(params.get_int("warmup_steps")), params.get_float("sample"));
}

}  // namespace gradcomp
#endif
