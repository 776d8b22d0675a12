#include "compressors/codecs/dgc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/sparse_checks.h"
#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/philox_cpu.h"
#include "kernels/select_collect.h"
#include "kernels/sparsify_ops.cuh"
#include "compressors/codecs/topk_select.h"
#include "kernels/wire_nan.cuh"

namespace gradcomp {
namespace {

// Below this many sample positions the threshold estimate is too noisy to be worth it: select exactly instead.
constexpr std::size_t kMinSample = 1024;
constexpr double kTolerance = 0.3;  // accept the sampled threshold when the count is within +-30% of k

std::vector<ParamSpec> dgc_params() {
  auto params = lossy_common_params();
  params.push_back(ParamSpec{"ratio", ParamSpec::Kind::kFloat, "0.001", 0.0, 1.0, true, {},
                             "final density, k = max(1, round(ratio*n))"});
  params.push_back(ParamSpec{"momentum", ParamSpec::Kind::kFloat, "0.9", 0.0, 0.999999, false, {},
                             "momentum m of the momentum correction (0 = plain accumulation)"});
  params.push_back(ParamSpec{"nesterov", ParamSpec::Kind::kBool, "off", 0, 0, false, {},
                             "Nesterov momentum correction: u = m*(u+g), v += u + g"});
  params.push_back(ParamSpec{"clip", ParamSpec::Kind::kFloat, "0", 0.0, 1e30, false, {},
                             "local gradient clipping: scale g so ||g||_2 <= clip (0 = off)"});
  params.push_back(ParamSpec{"warmup_steps", ParamSpec::Kind::kInt, "0", 0.0, 1e15, false, {},
                             "steps per warm-up stage (densities 25%, 6.25%, 1.5625%, 0.39%, then ratio); 0 = off"});
  params.push_back(ParamSpec{"sample", ParamSpec::Kind::kFloat, "0.01", 0.0, 1.0, true, {},
                             "fraction of elements sampled to estimate the threshold"});
  return params;
}

// Momentum correction of elements [begin, end) in place (kernels::dgc_accumulate, with g scaled when kScaled), and,
// when `part` is given, the (index, v) of every updated |v| >= threshold appended to it.
template <bool kNesterov, bool kScaled>
void update_chunk(const float* grad, float m, float scale, float* u, float* v, std::size_t begin, std::size_t end,
                  kernels::Candidates* part, std::uint32_t threshold) {
  std::optional<kernels::CandidateCollector> collector;
  if (part != nullptr) collector.emplace(*part, threshold);
  std::size_t i = begin;
#if defined(__AVX2__)
  const __m256 mv = _mm256_set1_ps(m), sv = _mm256_set1_ps(scale);
  for (; i + 8 <= end; i += 8) {
    __m256 g = _mm256_loadu_ps(grad + i);
    if constexpr (kScaled) g = _mm256_mul_ps(g, sv);
    __m256 uu = _mm256_loadu_ps(u + i), vv = _mm256_loadu_ps(v + i);
    if constexpr (kNesterov) {  // u = m*(u + g); v = v + (u + g)
      uu = _mm256_mul_ps(mv, _mm256_add_ps(uu, g));
      vv = _mm256_add_ps(vv, _mm256_add_ps(uu, g));
    } else {  // u = fma(m, u, g); v = v + u
      uu = _mm256_fmadd_ps(mv, uu, g);
      vv = _mm256_add_ps(vv, uu);
    }
    _mm256_storeu_ps(u + i, uu);
    _mm256_storeu_ps(v + i, vv);
    if (collector) collector->add8(vv, static_cast<std::uint32_t>(i));
  }
#endif
  for (; i < end; ++i) {
    kernels::dgc_accumulate(kScaled ? grad[i] * scale : grad[i], m, kNesterov, u[i], v[i]);
    if (collector) collector->add1(v[i], static_cast<std::uint32_t>(i));
  }
}

class DgcCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit DgcCompressor(const Params& params)
      : ErrorFeedbackCompressor("dgc", payload::CodecId::kDgc, dgc_compressor_info().traits, dgc_params(), params),
        ratio_(params.get_float("ratio")),
        momentum_(static_cast<float>(params.get_float("momentum"))),
        nesterov_(params.get_bool("nesterov")),
        clip_(params.get_float("clip")),
        warmup_steps_(static_cast<std::uint64_t>(params.get_int("warmup_steps"))),
        sample_(params.get_float("sample")) {
    GRADCOMP_CHECK(params.get_bool("ef"),
                   "compressor 'dgc': ef=off is not supported: DGC's accumulator v is its error feedback (use topk "
                   "with ef=off for memoryless sparsification)");
    GRADCOMP_CHECK(!(nesterov_ && momentum_ == 0.0f),
                   "compressor 'dgc': nesterov=on needs momentum > 0 (got momentum={})", params.get_string("momentum"));
  }

  std::size_t max_payload_bytes(std::size_t numel) const override {
    // Checked here, before anything is allocated: compress() asks for this bound before it creates any state (a
    // 2^31-element tensor with ef=on used to allocate its residual first), and callers size buffers with it.
    sparse::check_index_limit("dgc", numel);
    const double densest = kernels::dgc_density(0, warmup_steps_, ratio_);
    const std::size_t k = kernels::k_of_ratio(densest, numel);
    const std::size_t bound = std::min<std::size_t>(numel, k + static_cast<std::size_t>(kTolerance * k) + 1);
    return sparse::index_value_bytes(bound, sparse::ValueType::kF32);
  }

 protected:
  std::size_t extra_state_buffers() const override { return 1; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("dgc", args.ctx->name, n);
    TensorState& state = *args.state;
    float* v = args.residual;
    if (v == nullptr) {  // the non-finite "skip" path encodes zeros against throw-away state
      skip_accumulator_.assign(n, 0.0f);
      v = skip_accumulator_.data();
    }
    float* u = state.buffers[1].data();
    const float* grad = args.grad;
    const float scale = clip_scale(grad, n, args.threads);  // local gradient clipping
    const double density = kernels::dgc_density(args.ctx->step, warmup_steps_, ratio_);
    const std::size_t k = kernels::k_of_ratio(density, n);
    std::uint32_t threshold = 0;
    const bool sampled = sampled_threshold(args, scale, u, v, k, threshold);

    // Momentum correction + accumulation (+ the candidates |v| >= threshold): one pass over g, u, v.
    const std::size_t chunk = kernels::kParallelChunk;
    const float m = momentum_;
    const bool nesterov = nesterov_;
    parts_.resize(sampled ? (n + chunk - 1) / chunk : 0);
    for (auto& part : parts_) part.clear();
    kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t c, std::size_t begin, std::size_t end) {
      kernels::Candidates* part = sampled ? &parts_[c] : nullptr;
      if (scale == 1.0f && !nesterov) {
        update_chunk<false, false>(grad, m, scale, u, v, begin, end, part, threshold);
      } else if (scale == 1.0f) {
        update_chunk<true, false>(grad, m, scale, u, v, begin, end, part, threshold);
      } else if (!nesterov) {
        update_chunk<false, true>(grad, m, scale, u, v, begin, end, part, threshold);
      } else {
        update_chunk<true, true>(grad, m, scale, u, v, begin, end, part, threshold);
      }
    });
    select(v, n, k, sampled, threshold, args, state);
    return write_selected(args, u, v, out, stats);
  }

  // The factor of local gradient clipping: clip / ||g||_2 when the norm exceeds clip, else 1; the norm from
  // per-chunk f64 partial sums combined in chunk order.
  float clip_scale(const float* grad, std::size_t n, int threads) const {
    if (!(clip_ > 0.0 && n > 0)) return 1.0f;
    const std::size_t chunks = (n + kernels::kParallelChunk - 1) / kernels::kParallelChunk;
    std::vector<double> partial(chunks, 0.0);
    kernels::parallel_chunks(n, kernels::kParallelChunk, threads,
                             [&](std::size_t c, std::size_t begin, std::size_t end) {
                               double sum = 0.0;
                               for (std::size_t i = begin; i < end; ++i) sum += double(grad[i]) * grad[i];
                               partial[c] = sum;
                             });
    double sum = 0.0;
    for (const double p : partial) sum += p;
    const double norm = std::sqrt(sum);
    return norm > clip_ ? static_cast<float>(clip_ / norm) : 1.0f;
  }

  // The candidate threshold for k of the tensor's values: true, with `threshold` set, when the sample is large
  // enough to use (else selection is exact).
  //
  // Stratified sample of |v|: ceil(sample * chunk length) uniform positions inside each fixed 64K-element chunk from
  // the Philox stream of (tensor, step) with the chunk's first element index as counter base: identical for every
  // rank and thread count. The sampled keys are those of the *updated* accumulator v, computed here ahead of the
  // update pass (the same per-element math, nothing written), so that the pass that updates u and v can also collect
  // the candidates above the threshold: one pass over g, u, v instead of two.
  bool sampled_threshold(const EncodeArgs& args, float scale, const float* u, const float* v, std::size_t k,
                         std::uint32_t& threshold) {
    const std::size_t n = args.numel;
    const float* grad = args.grad;
    const std::size_t chunk = kernels::kParallelChunk;
    const std::size_t full_draws = draws_for(chunk);
    const std::size_t chunks = (n + chunk - 1) / chunk;
    const std::size_t total_draws = n == 0 ? 0 : (chunks - 1) * full_draws + draws_for(n - (chunks - 1) * chunk);
    const bool sampled = k < n && total_draws >= kMinSample;
    sample_keys_.resize(sampled ? total_draws : 0);
    if (!sampled) return false;
    const auto stream =
        kernels::PhiloxStream::make(0, args.tensor_key ^ kernels::kDgcSampleStreamSalt, args.ctx->step);
    const float m = momentum_;
    const bool nesterov = nesterov_;
    kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t c, std::size_t begin, std::size_t end) {
      const std::size_t length = end - begin, draws = draws_for(length);
      std::uint32_t* keys = sample_keys_.data() + c * full_draws;
      kernels::philox_fill(stream, begin, draws, keys);  // begin is a multiple of 4
      for (std::size_t j = 0; j < draws; ++j) {
        const std::size_t i = begin + kernels::uniform_below32(keys[j], length);
        float ui = u[i], vi = v[i];
        kernels::dgc_accumulate(scale == 1.0f ? grad[i] : grad[i] * scale, m, nesterov, ui, vi);
        keys[j] = kernels::magnitude_key(vi);
      }
    });
    const std::size_t samples = sample_keys_.size();
    const double scaled = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
    const std::size_t sample_k = std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(scaled)), 1, samples);
    std::nth_element(sample_keys_.begin(), sample_keys_.begin() + static_cast<std::ptrdiff_t>(sample_k - 1),
                     sample_keys_.end(), std::greater<std::uint32_t>());
    threshold = sample_keys_[sample_k - 1];
    return true;
  }

  // Writes the payload of the selected entries (selected_, positions into candidates_) and masks them
  // (momentum-factor masking: what was sent leaves the accumulator and the momentum).
  std::size_t write_selected(const EncodeArgs& args, float* u, float* v, std::span<std::byte> out,
                             CompressStats& stats) {
    const auto sections =
        sparse::write_index_value_header(payload::CodecId::kDgc, args.numel, args.original_dtype, selected_.size(),
                                         sparse::ValueType::kF32, out);
    const float prescale = args.ctx->prescale;
    for (std::size_t j = 0; j < selected_.size(); ++j) {
      const std::uint32_t i = candidates_.index[selected_[j]];
      const float value = candidates_.value[selected_[j]];
      const float wire = kernels::wire_f32(value * prescale);  // one NaN on the wire (kernels/wire_nan.cuh)
      sections.indices[j] = static_cast<std::int32_t>(i);
      std::memcpy(sections.values + j * sizeof(float), &wire, sizeof(float));
      v[i] = prescale == 1.0f ? value - wire : value - wire / prescale;
      u[i] = 0.0f;
    }
    stats.selected = selected_.size();
    return sections.total_bytes;
  }

  void validate(const payload::View& view, std::size_t numel) const override {
    sparse::check_dgc_value_type(view.header);
    sparse::validate_index_value(view, "dgc", numel);
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    validate(view, numel);
    sparse::decode_index_value(view, "dgc", out, numel, accumulate);
  }

 private:
  // Fills selected_ (ascending) with the step's selection and records the diagnostics scalars.
  // Elements sampled from a chunk of `length` elements.
  std::size_t draws_for(std::size_t length) const {
    return static_cast<std::size_t>(std::ceil(sample_ * static_cast<double>(length)));
  }

  // Fills selected_ (ascending; positions into candidates_) with the step's selection from the candidates the
  // update pass collected at the sampled threshold (or exactly when !sampled) and records the diagnostics scalars.
  void select(const float* v, std::size_t n, std::size_t k, bool sampled, std::uint32_t threshold,
              const EncodeArgs& args, TensorState& state) {
    state.scalars.assign(kDgcScalarCount, 0.0);
    state.scalars[kDgcTargetK] = static_cast<double>(k);
    auto exact = [&] {
      kernels::select_topk(v, n, k, args.threads, exact_);
      candidates_.index.assign(exact_.begin(), exact_.end());
      candidates_.value.resize(exact_.size());
      for (std::size_t j = 0; j < exact_.size(); ++j) candidates_.value[j] = v[exact_[j]];
      selected_.resize(exact_.size());
      std::iota(selected_.begin(), selected_.end(), 0u);
      state.scalars[kDgcPath] = 2;
    };
    if (!sampled) {  // k >= n, or a small tensor: exact selection is as cheap as sampling
      exact();
      return;
    }
    kernels::concat_candidates(parts_, candidates_);
    const double count = static_cast<double>(candidates_.size());
    float threshold_value;
    std::memcpy(&threshold_value, &threshold, sizeof(threshold));
    state.scalars[kDgcThreshold] = threshold_value;
    state.scalars[kDgcSampledCount] = count;
    const double lower = (1.0 - kTolerance) * static_cast<double>(k), upper = (1.0 + kTolerance) * static_cast<double>(k);
    if (count > upper) {
      kernels::select_among_candidates(candidates_, k, selected_);
      state.scalars[kDgcPath] = 1;
    } else if (count < lower) {
      exact();
    } else {
      selected_.resize(candidates_.size());
      std::iota(selected_.begin(), selected_.end(), 0u);
      state.scalars[kDgcPath] = 0;
    }
  }

  double ratio_;
  float momentum_;
  bool nesterov_;
  double clip_;
  std::uint64_t warmup_steps_;
  double sample_;
  std::vector<float> skip_accumulator_;
  std::vector<std::uint32_t> sample_keys_, selected_, exact_;
  std::vector<kernels::Candidates> parts_;
  kernels::Candidates candidates_;
};

}  // namespace

CompressorInfo dgc_compressor_info() {
  CompressorInfo info;
  info.name = "dgc";
  info.summary = "deep gradient compression: momentum correction, masking, sampled threshold, warm-up";
  info.traits.gatherable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kF32;
  info.params = dgc_params();
  info.factory = [](const Params& params) { return std::make_unique<DgcCompressor>(params); };
  return info;
}

}  // namespace gradcomp
