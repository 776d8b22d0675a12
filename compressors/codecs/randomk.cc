#include "compressors/codecs/randomk.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/sparse_checks.h"
#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/philox_cpu.h"
#include "kernels/sparsify_ops.cuh"
#include "kernels/stream_store.h"
#include "kernels/wire_nan.cuh"

namespace gradcomp {
namespace {

// Payload: header param0 = 0, param1 = k; section 0 = four u64 {seed, tensor_key, step, k}; section 1 = k f32 values
// in ascending index order.
constexpr std::size_t kStreamSectionBytes = sparse::kRandomKStreamBytes;

std::vector<ParamSpec> randomk_params() {
  auto params = lossy_common_params();
  params.push_back(ParamSpec{"ratio", ParamSpec::Kind::kFloat, "0.01", 0.0, 1.0, true, {},
                             "fraction of elements sent, k = max(1, round(ratio*n))"});
  params.push_back(ParamSpec{"seed", ParamSpec::Kind::kInt, "0", 0.0, 9007199254740991.0, false, {},
                             "seed of the index stream (must be equal on every rank)"});
  return params;
}

// Elements [begin, end): v = residual + grad (grad when residual is null) stored to next (unless null; streamed
// when `stream`); returns the number of non-finite grad values.
std::size_t ef_pass(const float* grad, const float* residual, float* next, bool stream, std::size_t begin,
                    std::size_t end) {
  std::size_t i = begin, bad = 0;
#if defined(__AVX2__)
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  __m256i bad_lanes = _mm256_setzero_si256();
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(grad + i);
    if (next != nullptr) {
      kernels::store8(next + i, residual != nullptr ? _mm256_add_ps(_mm256_loadu_ps(residual + i), g) : g, stream);
    }
    const __m256i exponent = _mm256_and_si256(_mm256_castps_si256(g), exp_mask);
    bad_lanes = _mm256_sub_epi32(bad_lanes, _mm256_cmpeq_epi32(exponent, exp_mask));
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bad_lanes);
  for (const std::uint32_t lane : lanes) bad += lane;
#endif
  for (; i < end; ++i) {
    if (next != nullptr) next[i] = residual != nullptr ? kernels::ef_accumulate(residual[i], grad[i]) : grad[i];
    bad += std::isfinite(grad[i]) ? 0 : 1;
  }
  kernels::stream_fence(stream);
  return bad;
}

class RandomKCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit RandomKCompressor(const Params& params)
      : ErrorFeedbackCompressor("randomk", payload::CodecId::kRandomK, randomk_compressor_info().traits,
                                randomk_params(), params),
        ratio_(params.get_float("ratio")),
        seed_(static_cast<std::uint64_t>(params.get_int("seed"))) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    // Checked here, before anything is allocated: compress() asks for this bound before it creates any state (a
    // 2^31-element tensor with ef=on used to allocate its residual first), and callers size buffers with it.
    sparse::check_index_limit("randomk", numel);
    const std::size_t k = kernels::k_of_ratio(ratio_, numel);
    return payload::kHeaderBytes + kStreamSectionBytes + k * sizeof(float);
  }

 protected:
  // The EF pass counts non-finite gradient values and writes the new residual to residual_out: no separate scan.
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("randomk", args.ctx->name, n);
    const std::size_t k = kernels::k_of_ratio(ratio_, n);
    indices_for(seed_, args.tensor_key, args.ctx->step, n, k);

    // v = residual + grad into the fused path's second buffer (or in place), counting non-finite gradient values;
    // with ef=off v is the gradient and only the count is taken.
    const float* grad = args.grad;
    const float* residual = args.residual;
    float* next = args.residual_out != nullptr ? args.residual_out : args.residual;
    const float* values = next != nullptr ? next : grad;
    const std::size_t chunks = (n + kernels::kParallelChunk - 1) / kernels::kParallelChunk;
    bad_counts_.assign(chunks, 0);
    const bool streamed = next != nullptr && next != residual && kernels::use_stream_stores(next, n, false);
    kernels::parallel_chunks(n, kernels::kParallelChunk, args.threads,
                             [&](std::size_t c, std::size_t begin, std::size_t end) {
                               bad_counts_[c] = ef_pass(grad, residual, next, streamed, begin, end);
                             });
    std::size_t nonfinite = 0, first_bad = n;
    for (std::size_t c = 0; c < chunks; ++c) {
      nonfinite += bad_counts_[c];
      if (bad_counts_[c] > 0 && first_bad == n) {
        for (std::size_t i = c * kernels::kParallelChunk; i < n; ++i) {
          if (!std::isfinite(grad[i])) {
            first_bad = i;
            break;
          }
        }
      }
    }
    stats.nonfinite = nonfinite;
    if (args.first_nonfinite != nullptr) *args.first_nonfinite = first_bad;

    const payload::Header header = sparse::randomk_header(n, args.original_dtype, k);
    const std::size_t total = payload::write_header(header, out);
    const std::uint64_t stream[4] = {seed_, args.tensor_key, args.ctx->step, k};
    std::memcpy(out.data() + payload::section_offset(header, 0), stream, sizeof(stream));
    std::byte* body = out.data() + payload::section_offset(header, 1);
    const float scale = args.ctx->prescale;
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t i = indices_[j];
      const float v = values[i];
      const float wire = kernels::wire_f32(v * scale);  // one NaN on the wire (kernels/wire_nan.cuh)
      std::memcpy(body + j * sizeof(float), &wire, sizeof(float));
      if (next != nullptr) next[i] = scale == 1.0f ? v - wire : v - wire / scale;
    }
    stats.selected = k;
    return total;
  }

  void validate(const payload::View& view, std::size_t numel) const override {
    sparse::check_randomk_layout(view, view.sections[0], numel);
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    validate(view, numel);
    std::uint64_t stream[4];
    std::memcpy(stream, view.sections[0].data(), sizeof(stream));
    const std::uint64_t k = stream[3];
    indices_for(stream[0], stream[1], stream[2], numel, k);
    if (!accumulate && numel > 0) std::memset(out, 0, numel * sizeof(float));
    const std::byte* body = view.sections[1].data();
    for (std::size_t j = 0; j < k; ++j) {
      float value;
      std::memcpy(&value, body + j * sizeof(float), sizeof(float));
      if (accumulate) {
        out[indices_[j]] += value;
      } else {
        out[indices_[j]] = value;
      }
    }
  }

 private:
  // indices_ = randomk_indices(seed, key, step, n, k), reusing the last ones when the arguments repeat (a decode of
  // the payload just encoded, or of every rank's payload of one step: the indices are a pure function of them).
  void indices_for(std::uint64_t seed, std::uint64_t key, std::uint64_t step, std::uint64_t n, std::uint64_t k) {
    const std::array<std::uint64_t, 5> id = {seed, key, step, n, k};
    if (have_indices_ && id == indices_id_) return;
    have_indices_ = false;  // stays false if randomk_indices throws
    randomk_indices(seed, key, step, n, k, indices_);
    indices_id_ = id;
    have_indices_ = true;
  }

  double ratio_;
  std::uint64_t seed_;
  std::vector<std::uint32_t> indices_;
  std::array<std::uint64_t, 5> indices_id_{};
  bool have_indices_ = false;
  std::vector<std::size_t> bad_counts_;
};

}  // namespace

void randomk_indices(std::uint64_t seed, std::uint64_t tensor_key, std::uint64_t step, std::uint64_t n,
                     std::uint64_t k, std::vector<std::uint32_t>& out) {
  GRADCOMP_ASSERT(k <= n, "random-k of {} from {}", k, n);
  out.clear();
  if (k == n) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0u);
    return;
  }
  // Floyd's algorithm: for j = n-k .. n-1 draw t uniform in [0, j]; insert t, or j if t is already chosen. Every
  // k-subset is equally likely. A bitmap marks the chosen positions; scanning it yields them in ascending order.
  const auto stream = kernels::PhiloxStream::make(seed, tensor_key ^ kernels::kRandomKStreamSalt, step);
  // Draw d = j - (n-k) takes the 64 bits of stream words 2d, 2d+1 (kernels::philox_bits64), generated here in
  // batches with the vectorized Philox (kernels/philox_cpu.h): the same bits as floyd_candidate().
  std::vector<std::uint64_t> bitmap((n + 63) / 64, 0);
  constexpr std::uint64_t kBatch = 2048;  // draws per batch (even, so every batch starts on a Philox block)
  std::uint32_t words[2 * kBatch];
  for (std::uint64_t first = 0; first < k; first += kBatch) {
    const std::uint64_t count = std::min<std::uint64_t>(kBatch, k - first);
    kernels::philox_fill(stream, 2 * first, static_cast<std::size_t>(2 * count), words);
    for (std::uint64_t d = 0; d < count; ++d) {
      const std::uint64_t j = n - k + first + d;
      const std::uint64_t bits = (static_cast<std::uint64_t>(words[2 * d]) << 32) | words[2 * d + 1];
      const std::uint64_t t = kernels::uniform_below(bits, j + 1);
      const std::uint64_t pick = (bitmap[t >> 6] >> (t & 63)) & 1u ? j : t;
      bitmap[pick >> 6] |= std::uint64_t{1} << (pick & 63);
    }
  }
  out.reserve(k);
  for (std::size_t w = 0; w < bitmap.size(); ++w) {
    std::uint64_t word = bitmap[w];
    while (word != 0) {
      const int bit = __builtin_ctzll(word);
      out.push_back(static_cast<std::uint32_t>(w * 64 + static_cast<std::size_t>(bit)));
      word &= word - 1;
    }
  }
}

CompressorInfo randomk_compressor_info() {
  CompressorInfo info;
  info.name = "randomk";
  info.summary = "random-k with error feedback: values only, indices regenerated from (seed, tensor, step)";
  info.traits.gatherable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kF32;
  info.params = randomk_params();
  info.factory = [](const Params& params) { return std::make_unique<RandomKCompressor>(params); };
  return info;
}

}  // namespace gradcomp
