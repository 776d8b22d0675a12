#include "compressors/randomk.h"

#include <cstring>
#include <limits>
#include <numeric>

#include "compressors/error_feedback.h"
#include "compressors/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp {
namespace {

// Payload: header param0 = 0, param1 = k; section 0 = four u64 {seed, tensor_key, step, k}; section 1 = k f32 values
// in ascending index order.
constexpr std::size_t kStreamSectionBytes = 4 * sizeof(std::uint64_t);
constexpr std::size_t kMaxIndexable = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

std::vector<ParamSpec> randomk_params() {
  auto params = lossy_common_params();
  params.push_back(ParamSpec{"ratio", ParamSpec::Kind::kFloat, "0.01", 0.0, 1.0, true, {},
                             "fraction of elements sent, k = max(1, round(ratio*n))"});
  params.push_back(ParamSpec{"seed", ParamSpec::Kind::kInt, "0", 0.0, 9007199254740991.0, false, {},
                             "seed of the index stream (must be equal on every rank)"});
  return params;
}

class RandomKCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit RandomKCompressor(const Params& params)
      : ErrorFeedbackCompressor("randomk", payload::CodecId::kRandomK, randomk_compressor_info().traits,
                                randomk_params(), params),
        ratio_(params.get_float("ratio")),
        seed_(static_cast<std::uint64_t>(params.get_int("seed"))) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    const std::size_t k = kernels::k_of_ratio(ratio_, numel);
    return payload::kHeaderBytes + kStreamSectionBytes + k * sizeof(float);
  }

 protected:
  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    GRADCOMP_CHECK(n <= kMaxIndexable, "compressor 'randomk': tensor '{}' has {} elements (at most {} supported)",
                   args.ctx->name, n, kMaxIndexable);
    const std::size_t k = kernels::k_of_ratio(ratio_, n);
    randomk_indices(seed_, args.tensor_key, args.ctx->step, n, k, selected_);

    const float* values = args.grad;
    if (args.residual != nullptr) {
      float* residual = args.residual;
      const float* grad = args.grad;
      kernels::parallel_chunks(n, kernels::kParallelChunk, args.threads,
                               [&](std::size_t, std::size_t begin, std::size_t end) {
                                 for (std::size_t i = begin; i < end; ++i) {
                                   residual[i] = kernels::ef_accumulate(residual[i], grad[i]);
                                 }
                               });
      values = residual;
    }

    payload::Header header;
    header.codec = payload::CodecId::kRandomK;
    header.numel = n;
    header.dtype = args.original_dtype;
    header.param1 = static_cast<std::uint32_t>(k);
    header.section_count = 2;
    header.section_bytes[0] = kStreamSectionBytes;
    header.section_bytes[1] = k * sizeof(float);
    const std::size_t total = payload::write_header(header, out);
    const std::uint64_t stream[4] = {seed_, args.tensor_key, args.ctx->step, k};
    std::memcpy(out.data() + payload::section_offset(header, 0), stream, sizeof(stream));
    std::byte* body = out.data() + payload::section_offset(header, 1);
    const float scale = args.ctx->prescale;
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t i = selected_[j];
      const float v = values[i];
      const float wire = v * scale;
      std::memcpy(body + j * sizeof(float), &wire, sizeof(float));
      if (args.residual != nullptr) args.residual[i] = scale == 1.0f ? v - wire : v - wire / scale;
    }
    stats.selected = k;
    return total;
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    const payload::Header& header = view.header;
    GRADCOMP_CHECK_AS(CorruptPayload,
                      header.section_count == 2 && header.flags == 0 && header.param0 == 0 &&
                          view.sections[0].size() == kStreamSectionBytes,
                      "corrupt randomk payload: {} sections, flags {:#x}, param0 {}, stream section {} bytes "
                      "(expected 2, 0, 0, {})",
                      header.section_count, header.flags, header.param0, view.sections[0].size(), kStreamSectionBytes);
    GRADCOMP_CHECK_AS(CorruptPayload, numel <= kMaxIndexable, "corrupt randomk payload: {} elements (at most {})",
                      numel, kMaxIndexable);
    std::uint64_t stream[4];
    std::memcpy(stream, view.sections[0].data(), sizeof(stream));
    const std::uint64_t k = stream[3];
    GRADCOMP_CHECK_AS(CorruptPayload, k <= numel && header.param1 == k && view.sections[1].size() == k * sizeof(float),
                      "corrupt randomk payload: k = {} (header {}) with {} value bytes for a tensor of {} elements",
                      k, header.param1, view.sections[1].size(), numel);
    randomk_indices(stream[0], stream[1], stream[2], numel, k, indices_);
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
  double ratio_;
  std::uint64_t seed_;
  std::vector<std::uint32_t> selected_, indices_;
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
  std::vector<std::uint64_t> bitmap((n + 63) / 64, 0);
  for (std::uint64_t j = n - k; j < n; ++j) {
    const std::uint64_t t = kernels::floyd_candidate(stream, n, k, j);
    const std::uint64_t pick = (bitmap[t >> 6] >> (t & 63)) & 1u ? j : t;
    bitmap[pick >> 6] |= std::uint64_t{1} << (pick & 63);
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
