#include "compressors/codecs/topk.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/sparse_checks.h"
#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/select_collect.h"
#include "kernels/sparsify_ops.cuh"
#include "kernels/stream_store.h"
#include "compressors/codecs/topk_select.h"
#include "kernels/wire_nan.cuh"

namespace gradcomp {
namespace {

constexpr double kDefaultRatio = 0.01;
using sparse::kMaxIndexable;

std::vector<ParamSpec> topk_params() {
  auto params = lossy_common_params();
  params.push_back(ParamSpec{"ratio", ParamSpec::Kind::kFloat, "0.01", 0.0, 1.0, true, {},
                             "fraction of elements sent, k = max(1, round(ratio*n)) (not with k)"});
  params.push_back(ParamSpec{"k", ParamSpec::Kind::kInt, "", 1.0, static_cast<double>(kMaxIndexable), false, {},
                             "number of elements sent, clamped to the tensor size (replaces ratio)", "ratio"});
  params.push_back(ParamSpec{"values", ParamSpec::Kind::kChoice, "f32", 0, 0, false, {"f32", "f16"},
                             "wire type of the sent values (f16 saturates at +-65504, counted as saturated)"});
  return params;
}

// Non-finite gradient values of one chunk: count and smallest index (the tensor size when none).
struct Tally {
  std::size_t nonfinite;
  std::size_t first;
};

// Elements [begin, end) of the fused pass: v = residual + grad (grad when residual is null), stored to next[i]
// (unless null; non-temporal when `stream`), non-finite grad values tallied, and v either offered to `part` (keys
// >= threshold are kept) or counted in the key histogram `row` (neither when both are null: a small tensor).
void fused_pass(const float* grad, const float* residual, float* next, bool stream, std::size_t begin, std::size_t end,
                kernels::Candidates* part, std::uint32_t threshold, std::uint32_t* row, Tally& tally) {
  std::optional<kernels::CandidateCollector> collector;
  if (part != nullptr) collector.emplace(*part, threshold);
  std::size_t i = begin;
  std::size_t bad = 0;
#if defined(__AVX2__)
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  __m256i bad_lanes = _mm256_setzero_si256();
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(grad + i);
    const __m256 v = residual != nullptr ? _mm256_add_ps(_mm256_loadu_ps(residual + i), g) : g;
    if (next != nullptr) kernels::store8(next + i, v, stream);
    const __m256i exponent = _mm256_and_si256(_mm256_castps_si256(g), exp_mask);
    bad_lanes = _mm256_sub_epi32(bad_lanes, _mm256_cmpeq_epi32(exponent, exp_mask));
    if (collector) {
      collector->add8(v, static_cast<std::uint32_t>(i));
    } else if (row != nullptr) {
      alignas(32) std::uint32_t keys[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(keys),
                         _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF)));
      for (int j = 0; j < 8; ++j) ++row[kernels::key_bucket(keys[j])];
    }
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bad_lanes);
  for (const std::uint32_t lane : lanes) bad += lane;
#endif
  for (; i < end; ++i) {
    const float v = residual != nullptr ? kernels::ef_accumulate(residual[i], grad[i]) : grad[i];
    if (next != nullptr) next[i] = v;
    bad += std::isfinite(grad[i]) ? 0 : 1;
    if (collector) {
      collector->add1(v, static_cast<std::uint32_t>(i));
    } else if (row != nullptr) {
      ++row[kernels::key_bucket(kernels::magnitude_key(v))];
    }
  }
  kernels::stream_fence(stream);
  tally.nonfinite = bad;
  if (bad > 0) {
    for (std::size_t j = begin; j < end; ++j) {
      if (!std::isfinite(grad[j])) {
        tally.first = j;
        break;
      }
    }
  }
}

class TopKCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit TopKCompressor(const Params& params)
      : ErrorFeedbackCompressor("topk", payload::CodecId::kTopK, topk_compressor_info().traits, topk_params(),
                                params) {
    // The registry refuses ratio with k, and gives ratio its default only without k.
    if (params.has("k")) fixed_k_ = static_cast<std::size_t>(params.get_int("k"));
    ratio_ = params.has("ratio") ? params.get_float("ratio") : kDefaultRatio;
    type_ = params.get_string("values") == "f16" ? sparse::ValueType::kF16 : sparse::ValueType::kF32;
  }

  std::size_t k_for(std::size_t n) const {
    if (n == 0) return 0;
    if (fixed_k_ > 0) return std::min(fixed_k_, n);
    return static_cast<std::size_t>(kernels::k_of_ratio(ratio_, n));
  }

  std::size_t max_payload_bytes(std::size_t numel) const override {
    // Checked here, before anything is allocated: compress() asks for this bound before it creates any state (a
    // 2^31-element tensor with ef=on used to allocate its residual first), and callers size buffers with it.
    sparse::check_index_limit("topk", numel);
    return sparse::index_value_bytes(k_for(numel), type_);
  }

 protected:
  // The fused pass counts non-finite gradient values and writes the new residual to residual_out (the base applies
  // the policy afterwards), so there is no separate scan of the gradient.
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("topk", args.ctx->name, n);
    const std::size_t k = k_for(n);
    const float* grad = args.grad;
    const float* residual = args.residual;
    // Where v = residual + grad goes: the fused path's second buffer, or the residual itself (in place); null with
    // ef=off, where v is the gradient.
    float* next = args.residual_out != nullptr ? args.residual_out : args.residual;
    const float* values = next != nullptr ? next : grad;

    // 1. A bound on the k-th largest |v| from a fixed sample (read before the pass: the in-place path overwrites r).
    std::uint32_t threshold = 0;
    bool collect = sampled_bound(grad, residual, n, k, args.threads, threshold);

    // 2. One pass: v = r + g -> next, non-finite count of g, and the candidates with |v| >= bound (or, without a
    //    usable bound, the key histogram of v).
    const std::size_t chunks = (n + kernels::kSelectChunk - 1) / kernels::kSelectChunk;
    const bool small = n <= kernels::kDirectSelectMax;  // selected directly from v, no histogram
    tallies_.assign(chunks, Tally{0, n});
    if (collect) {
      parts_.resize(chunks);
      for (auto& part : parts_) part.clear();
    } else if (!small) {
      histogram_.reset(n);
    }
    const bool stream = next != nullptr && next != residual && kernels::use_stream_stores(next, n, false);
    kernels::parallel_chunks(n, kernels::kSelectChunk, args.threads,
                             [&](std::size_t c, std::size_t begin, std::size_t end) {
                               fused_pass(grad, residual, next, stream, begin, end, collect ? &parts_[c] : nullptr,
                                          threshold, collect || small ? nullptr : histogram_.row(c), tallies_[c]);
                             });
    std::size_t nonfinite = 0, first_bad = n;
    for (const Tally& tally : tallies_) {
      nonfinite += tally.nonfinite;
      first_bad = std::min(first_bad, tally.first);
    }
    stats.nonfinite = nonfinite;
    if (args.first_nonfinite != nullptr) *args.first_nonfinite = first_bad;

    // 3. Exact top-k among the candidates; the histogram select when there was no bound or too few reached it.
    choose(values, n, k, collect, args.threads);
    return write_chosen(args, next, out, stats);
  }

  // Writes the payload of the chosen entries (chosen_ into candidates_) and their residual' = v - transmitted.
  std::size_t write_chosen(const EncodeArgs& args, float* next, std::span<std::byte> out, CompressStats& stats) {
    const std::size_t n = args.numel;
    const auto sections = sparse::write_index_value_header(payload::CodecId::kTopK, n, args.original_dtype,
                                                           chosen_.size(), type_, out);
    const float scale = args.ctx->prescale;
    std::size_t saturated = 0;
    for (std::size_t j = 0; j < chosen_.size(); ++j) {
      const std::uint32_t c = chosen_[j];
      const std::uint32_t i = candidates_.index[c];
      const float v = candidates_.value[c];
      const float wire = kernels::wire_f32(v * scale);  // one NaN on the wire (kernels/wire_nan.cuh)
      float decoded = wire;
      sections.indices[j] = static_cast<std::int32_t>(i);
      if (type_ == sparse::ValueType::kF16) {
        bool clamped = false;
        const std::uint16_t bits = kernels::sparse_value_to_half(wire, clamped);
        saturated += clamped;
        std::memcpy(sections.values + j * sizeof(bits), &bits, sizeof(bits));
        decoded = kernels::half_bits_to_float(bits);
      } else {
        std::memcpy(sections.values + j * sizeof(wire), &wire, sizeof(wire));
      }
      // residual' = v - transmitted (in gradient units): exactly 0 for f32 values at prescale 1.
      if (next != nullptr) next[i] = scale == 1.0f ? v - decoded : v - decoded / scale;
    }
    stats.selected = chosen_.size();
    stats.saturated = saturated;
    return sections.total_bytes;
  }

  // Step 1 of encode(): true when every value with a key at least `threshold` (set here) is a candidate, from a
  // fixed sample of v = r + g (k >= n: everything, threshold 0); false when the sample gives no usable bound.
  bool sampled_bound(const float* grad, const float* residual, std::size_t n, std::size_t k, int threads,
                     std::uint32_t& threshold) {
    if (k >= n) return true;
    sample_keys_.resize(kernels::sample_count(n));
    kernels::parallel_chunks(sample_keys_.size(), kernels::kParallelChunk, threads,
                             [&](std::size_t, std::size_t begin, std::size_t end) {
                               for (std::size_t s = begin; s < end; ++s) {
                                 const std::size_t i = kernels::sample_position(s, n);
                                 const float v = residual ? kernels::ef_accumulate(residual[i], grad[i]) : grad[i];
                                 sample_keys_[s] = kernels::magnitude_key(v);
                               }
                             });
    return kernels::sampled_lower_bound(sample_keys_, n, k, threshold);
  }

  // Step 3 of encode(): the exact top k of `values` into chosen_ (positions in candidates_).
  void choose(const float* values, std::size_t n, std::size_t k, bool collect, int threads) {
    bool chosen = false;
    if (collect) {
      kernels::concat_candidates(parts_, candidates_);
      if (candidates_.size() >= k) {
        kernels::select_among_candidates(candidates_, k, chosen_);
        chosen = true;
      }
    }
    if (chosen) return;
    const bool built = !collect && k < n && n > kernels::kDirectSelectMax;  // encode() built histogram_
    kernels::select_topk(values, n, k, threads, selected_, built ? &histogram_ : nullptr);
    candidates_.index.assign(selected_.begin(), selected_.end());
    candidates_.value.resize(selected_.size());
    for (std::size_t j = 0; j < selected_.size(); ++j) candidates_.value[j] = values[selected_[j]];
    chosen_.resize(selected_.size());
    std::iota(chosen_.begin(), chosen_.end(), 0u);
  }

  void validate(const payload::View& view, std::size_t numel) const override {
    sparse::validate_index_value(view, "topk", numel);
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    sparse::decode_index_value(view, "topk", out, numel, accumulate);
  }

 private:
  std::size_t fixed_k_ = 0;
  double ratio_ = kDefaultRatio;
  sparse::ValueType type_ = sparse::ValueType::kF32;
  kernels::KeyHistogram histogram_;
  std::vector<std::uint32_t> sample_keys_, selected_, chosen_;
  std::vector<kernels::Candidates> parts_;
  kernels::Candidates candidates_;
  std::vector<Tally> tallies_;
};

}  // namespace

CompressorInfo topk_compressor_info() {
  CompressorInfo info;
  info.name = "topk";
  info.summary = "exact top-k by magnitude with error feedback: int32 index + value pairs";
  info.traits.gatherable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kF32;
  info.params = topk_params();
  info.factory = [](const Params& params) { return std::make_unique<TopKCompressor>(params); };
  return info;
}

}  // namespace gradcomp
