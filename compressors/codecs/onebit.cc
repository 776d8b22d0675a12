#include "compressors/codecs/onebit.h"

#include <cmath>
#include <vector>

#include "compressors/codecs/bucket_quantizer.h"
#include "kernels/onebit_ops.cuh"
#include "kernels/stream_store.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp {
namespace {

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
  (void)groups;
#endif
  for (; 8 * k < n; ++k) {  // no AVX2, and the last (partial) group
    const std::size_t lanes = n - 8 * k < 8 ? n - 8 * k : 8;
    std::uint32_t byte = 0;
    for (std::size_t j = 0; j < lanes; ++j) {
      const std::size_t i = 8 * k + j;
      const float v = r ? g[i] + r[i] : g[i];
      const std::uint32_t bit = kernels::onebit_encode(v);
      byte |= bit << j;
      if (r) r_out[i] = v - kernels::onebit_decode(bit, scale);
    }
    bits[k] = static_cast<std::uint8_t>(byte);
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

// 1-bit's rules: scale mean |v| per bucket; one sign bit per value, decoded to +-scale (deterministic).
struct OneBitPolicy {
  static constexpr std::string_view kName = "onebit";
  static constexpr bool kWholeTensor = false;
  static quantize::BucketLayout layout(const Params& params) { return onebit_layout(params); }

  explicit OneBitPolicy(const Params&) {}

  kernels::BucketStats stats(const float* g, const float* r, std::size_t n) const {
    return kernels::bucket_stats<kernels::kStatAbs>(g, r, n);
  }
  float scale(const kernels::BucketStats& s, const float* g, const float* r, std::size_t n) const {
    return mean_abs(s, g, r, n);
  }

  // No per-call state: the policy codes the signs itself.
  const OneBitPolicy& coder(const EncodeArgs&) const { return *this; }
  void quantize(const float* g, const float* r, float* r_out, std::size_t begin, std::size_t end, float scale,
                std::uint8_t* packed, bool stream_out) const {
    encode_signs(g + begin, r ? r + begin : nullptr, r ? r_out + begin : nullptr, end - begin, scale,
                 packed + begin / 8, stream_out);
  }
  void decode(const std::uint8_t* packed, std::size_t begin, std::size_t end, float scale, float* out, bool accumulate,
              bool stream) const {
    decode_signs(packed + begin / 8, end - begin, scale, out + begin, accumulate, stream);
  }
};

}  // namespace

quantize::BucketLayout onebit_layout(const Params& params) {
  const auto bucket = static_cast<std::size_t>(params.get_int("bucket"));
  return {payload::CodecId::kOneBit, OneBitPolicy::kName, 1, bucket, static_cast<std::uint32_t>(bucket), 1,
          "sign-bit"};
}

CompressorInfo onebit_compressor_info() {
  return quantize::bucket_quantizer_info<OneBitPolicy>(
      "1-bit / EF-signSGD: sign bits + mean |v| per bucket (Seide et al. 2014, Karimireddy et al. 2019)",
      {quantize::bucket_param("512", 8, "values per scale (a multiple of 8); scale = mean |v| of the bucket")});
}

}  // namespace gradcomp
