#include "compressors/onebit.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "compressors/error_feedback.h"
#include "compressors/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/bucket_reduce.h"
#include "kernels/cpu_parallel.h"
#include "kernels/onebit_ops.cuh"
#include "kernels/stream_store.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp {
namespace {

std::vector<ParamSpec> onebit_params() {
  std::vector<ParamSpec> params = {
      quantize::bucket_param("512", 8, "values per scale (a multiple of 8); scale = mean |v| of the bucket"),
  };
  for (auto& common : lossy_common_params()) params.push_back(std::move(common));
  return params;
}

// Mean |v| of a bucket; recomputed in double when the f32 sum overflows.
float mean_abs(const kernels::BucketStats& s, const float* g, const float* r, std::size_t n) {
  if (std::isfinite(s.sum_abs)) return s.sum_abs / static_cast<float>(n);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += std::fabs(static_cast<double>(r ? g[i] + r[i] : g[i]));
  return static_cast<float>(sum / static_cast<double>(n));
}

// Sign bits of v = g + r over [0, n) into bytes (n a multiple of 8 except at the tensor's end); the new residual
// goes to r_out (= r in place; non-null whenever r is; `stream`: non-temporal stores, the caller fences).
void encode_signs(const float* g, const float* r, float* r_out, std::size_t n, float scale, std::uint8_t* bits,
                  bool stream) {
  const std::size_t groups = n / 8;
  std::size_t k = 0;
#if defined(__AVX2__)
  const __m256 v_scale = _mm256_set1_ps(scale);
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  for (; k < groups; ++k) {
    __m256 v = _mm256_loadu_ps(g + 8 * k);
    if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + 8 * k));
    bits[k] = static_cast<std::uint8_t>(_mm256_movemask_ps(v));  // the sign bits = onebit_encode
    if (r) {
      const __m256 decoded = _mm256_xor_ps(v_scale, _mm256_and_ps(v, sign_mask));  // = onebit_decode
      kernels::store8(r_out + 8 * k, _mm256_sub_ps(v, decoded), stream);
    }
  }
#else
  (void)stream;
#endif
  for (; k < groups; ++k) {
    std::uint32_t byte = 0;
    for (std::size_t j = 0; j < 8; ++j) {
      const std::size_t i = 8 * k + j;
      const float v = r ? g[i] + r[i] : g[i];
      const std::uint32_t bit = kernels::onebit_encode(v);
      byte |= bit << j;
      if (r) r_out[i] = v - kernels::onebit_decode(bit, scale);
    }
    bits[k] = static_cast<std::uint8_t>(byte);
  }
  if (const std::size_t rest = n % 8) {
    std::uint32_t byte = 0;
    for (std::size_t j = 0; j < rest; ++j) {
      const std::size_t i = 8 * groups + j;
      const float v = r ? g[i] + r[i] : g[i];
      const std::uint32_t bit = kernels::onebit_encode(v);
      byte |= bit << j;
      if (r) r_out[i] = v - kernels::onebit_decode(bit, scale);
    }
    bits[groups] = static_cast<std::uint8_t>(byte);
  }
}

void decode_signs(const std::uint8_t* bits, std::size_t n, float scale, float* out, bool accumulate, bool stream) {
  std::size_t i = 0;
#if defined(__AVX2__)
  const __m256 v_scale = _mm256_set1_ps(scale);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (; i + 8 <= n; i += 8) {
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits[i / 8]), lane_bit), lane_bit);
    __m256 value = _mm256_xor_ps(v_scale, _mm256_castsi256_ps(_mm256_slli_epi32(set, 31)));  // = onebit_decode
    if (accumulate) value = _mm256_add_ps(_mm256_loadu_ps(out + i), value);
    kernels::store8(out + i, value, stream);
  }
#else
  (void)stream;
#endif
  for (; i < n; ++i) {
    const float value = kernels::onebit_decode((bits[i / 8] >> (i % 8)) & 1u, scale);
    out[i] = accumulate ? out[i] + value : value;
  }
}

class OneBitCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit OneBitCompressor(const Params& params)
      : ErrorFeedbackCompressor("onebit", payload::CodecId::kOneBit, onebit_compressor_info().traits,
                                onebit_params(), params),
        bucket_(static_cast<std::size_t>(params.get_int("bucket"))) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    return payload::total_bytes(header_for(numel, DType::kF32));
  }

 protected:
  // The bucket statistics already flag non-finite values, so the base's separate scan is folded into encode().
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    payload::Header header = header_for(n, args.original_dtype);
    GRADCOMP_CHECK(out.size() >= payload::total_bytes(header), "onebit: output buffer of {} bytes is too small ({})",
                   out.size(), payload::total_bytes(header));
    std::byte* scales = out.data() + payload::section_offset(header, 0);
    auto* bits = reinterpret_cast<std::uint8_t*>(out.data() + payload::section_offset(header, 1));
    const float prescale = args.ctx->prescale;
    const std::size_t chunk = quantize::bucket_chunk(bucket_);
    const std::size_t chunks = (n + chunk - 1) / chunk;
    std::vector<std::uint8_t> bad(chunks, 0);
    std::vector<std::size_t> bad_count(chunks, 0), bad_first(chunks, n);
    float* const residual_out = args.residual_out ? args.residual_out : args.residual;
    const bool stream_out = args.residual_out && kernels::use_stream_stores(residual_out, n, false);
    kernels::parallel_chunks(n, chunk, args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
      for (std::size_t b0 = begin; b0 < end; b0 += bucket_) {
        const std::size_t m = std::min(end, b0 + bucket_) - b0;
        const float* g = args.grad + b0;
        const float* r = args.residual ? args.residual + b0 : nullptr;
        float* r_out = args.residual ? residual_out + b0 : nullptr;
        const auto s = kernels::bucket_stats<kernels::kStatAbs>(g, r, m);
        float wire = 0.0f;
        if (s.nonfinite) {
          // nonfinite=pass: NaN scale (the bucket decodes to NaN), residual keeps the finite part of v.
          wire = std::numeric_limits<float>::quiet_NaN();
          bad[k] = 1;
          kernels::count_nonfinite_range(args.grad, b0, b0 + m, bad_count[k], bad_first[k]);
          if (r) {
            for (std::size_t i = 0; i < m; ++i) {
              const float v = g[i] + r[i];
              r_out[i] = std::isfinite(v) ? v : 0.0f;
            }
          }
          std::memset(bits + b0 / 8, 0, (m + 7) / 8);
        } else {
          const float scale = mean_abs(s, g, r, m);
          wire = scale * prescale;
          encode_signs(g, r, r_out, m, scale, bits + b0 / 8, stream_out);
        }
        std::memcpy(scales + (b0 / bucket_) * sizeof(float), &wire, sizeof(float));
      }
      kernels::stream_fence(stream_out);
    });
    for (const auto flag : bad) header.flags |= flag ? quantize::kFlagNonFinite : 0;
    const auto tally = quantize::combine_nonfinite(bad_count, bad_first, n);
    stats.nonfinite = tally.count;
    if (args.first_nonfinite) *args.first_nonfinite = tally.first;
    stats.selected = n;
    return payload::write_header(header, out);
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    const payload::Header expected = header_for(numel, DType::kF32);
    quantize::check_header(view, "onebit", expected.param0, expected.param1, quantize::kFlagNonFinite, 2);
    const std::size_t buckets = quantize::bucket_count(numel, bucket_);
    quantize::check_section(view, "onebit", 1, expected.section_bytes[1], "sign-bit");
    scales_.resize(buckets);
    quantize::read_scales(view, "onebit", 0, buckets, scales_.data());
    const auto* bits = reinterpret_cast<const std::uint8_t*>(view.sections[1].data());
    const bool stream = kernels::use_stream_stores(out, numel, accumulate);
    kernels::parallel_chunks(numel, quantize::bucket_chunk(bucket_), threads(),
                             [&](std::size_t, std::size_t begin, std::size_t end) {
                               for (std::size_t b0 = begin; b0 < end; b0 += bucket_) {
                                 decode_signs(bits + b0 / 8, std::min(end, b0 + bucket_) - b0, scales_[b0 / bucket_],
                                              out + b0, accumulate, stream);
                               }
                               kernels::stream_fence(stream);
                             });
  }

 private:
  payload::Header header_for(std::size_t numel, DType dtype) const {
    payload::Header header;
    header.codec = payload::CodecId::kOneBit;
    header.numel = numel;
    header.dtype = dtype;
    header.section_count = 2;
    header.section_bytes[0] = quantize::bucket_count(numel, bucket_) * sizeof(float);
    header.section_bytes[1] = (numel + 7) / 8;
    header.param0 = static_cast<std::uint32_t>(bucket_);
    header.param1 = 1;
    return header;
  }

  std::size_t bucket_;
  std::vector<float> scales_;
};

}  // namespace

CompressorInfo onebit_compressor_info() {
  CompressorInfo info;
  info.name = "onebit";
  info.summary = "1-bit / EF-signSGD: sign bits + mean |v| per bucket (Seide et al. 2014, Karimireddy et al. 2019)";
  info.traits.requantizable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kU8;
  info.params = onebit_params();
  info.factory = [](const Params& params) -> std::unique_ptr<Compressor> {
    quantize::check_bucket_multiple("onebit", params.get_int("bucket"), false);
    return std::make_unique<OneBitCompressor>(params);
  };
  return info;
}

}  // namespace gradcomp
