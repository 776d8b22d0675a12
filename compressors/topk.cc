#include "compressors/topk.h"

#include <cstring>
#include <limits>

#include "compressors/error_feedback.h"
#include "compressors/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/sparsify_ops.cuh"
#include "kernels/topk_select.h"

namespace gradcomp {
namespace {

constexpr double kDefaultRatio = 0.01;
constexpr std::size_t kMaxIndexable = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

std::vector<ParamSpec> topk_params() {
  auto params = lossy_common_params();
  params.push_back(ParamSpec{"ratio", ParamSpec::Kind::kFloat, "", 0.0, 1.0, true, {},
                             "fraction of elements sent, k = max(1, round(ratio*n)) (default 0.01; not with k)"});
  params.push_back(ParamSpec{"k", ParamSpec::Kind::kInt, "", 1.0, static_cast<double>(kMaxIndexable), false, {},
                             "number of elements sent, clamped to the tensor size (not with ratio)"});
  params.push_back(ParamSpec{"values", ParamSpec::Kind::kChoice, "f32", 0, 0, false, {"f32", "f16"},
                             "wire type of the sent values (f16 saturates at +-65504, counted as saturated)"});
  return params;
}

class TopKCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit TopKCompressor(const Params& params)
      : ErrorFeedbackCompressor("topk", payload::CodecId::kTopK, topk_compressor_info().traits, topk_params(),
                                params) {
    GRADCOMP_CHECK(!(params.given("ratio") && params.given("k")),
                   "compressor 'topk': give either ratio or k, not both (got ratio={}, k={})",
                   params.get_string("ratio"), params.get_string("k"));
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
    return sparse::index_value_bytes(k_for(numel), type_);
  }

 protected:
  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    GRADCOMP_CHECK(n <= kMaxIndexable, "compressor 'topk': tensor '{}' has {} elements; int32 indices address at most {}",
                   args.ctx->name, n, kMaxIndexable);
    const std::size_t k = k_for(n);
    const float* values = args.grad;
    if (args.residual != nullptr) {
      // Fused error feedback + key histogram: one pass over grad and residual.
      float* residual = args.residual;
      const float* grad = args.grad;
      histogram_.reset(n);
      kernels::parallel_chunks(n, kernels::kSelectChunk, args.threads,
                               [&](std::size_t c, std::size_t begin, std::size_t end) {
                                 std::uint32_t* row = histogram_.row(c);
                                 for (std::size_t i = begin; i < end; ++i) {
                                   const float v = kernels::ef_accumulate(residual[i], grad[i]);
                                   residual[i] = v;
                                   ++row[kernels::key_bucket(kernels::magnitude_key(v))];
                                 }
                               });
      values = residual;
      kernels::select_topk(values, n, k, args.threads, selected_, k < n ? &histogram_ : nullptr);
    } else {
      kernels::select_topk(values, n, k, args.threads, selected_);
    }

    const auto sections = sparse::write_index_value_header(payload::CodecId::kTopK, n, args.original_dtype,
                                                           selected_.size(), type_, out);
    const float scale = args.ctx->prescale;
    std::size_t saturated = 0;
    for (std::size_t j = 0; j < selected_.size(); ++j) {
      const std::uint32_t i = selected_[j];
      const float v = values[i];
      const float wire = v * scale;
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
      if (args.residual != nullptr) args.residual[i] = scale == 1.0f ? v - decoded : v - decoded / scale;
    }
    stats.selected = selected_.size();
    stats.saturated = saturated;
    return sections.total_bytes;
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    sparse::decode_index_value(view, "topk", out, numel, accumulate);
  }

 private:
  std::size_t fixed_k_ = 0;
  double ratio_ = kDefaultRatio;
  sparse::ValueType type_ = sparse::ValueType::kF32;
  kernels::KeyHistogram histogram_;
  std::vector<std::uint32_t> selected_;
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
