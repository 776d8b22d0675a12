#include "compressors/codecs/blocktopk.h"

#include <cstring>
#include <limits>
#include <numeric>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/sparse_checks.h"
#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/half_ops.cuh"
#include "kernels/sparsify_ops.cuh"
#include "compressors/codecs/topk_select.h"
#include "kernels/wire_nan.cuh"

namespace gradcomp {
namespace {

// Payload: header param0 = block size, param1 = kb; section 0 = kb int32 block ids, strictly increasing, each
// < ceil(numel / block); section 1 = the f32 values of those blocks, concatenated in id order (the last block of the
// tensor contributes numel - id*block values).
using sparse::kMaxBlock;

std::vector<ParamSpec> blocktopk_params() {
  auto params = lossy_common_params();
  params.push_back(ParamSpec{"ratio", ParamSpec::Kind::kFloat, "0.01", 0.0, 1.0, true, {},
                             "fraction of blocks sent, kb = max(1, round(ratio * blocks))"});
  params.push_back(ParamSpec{"block", ParamSpec::Kind::kInt, "256", 1.0, static_cast<double>(kMaxBlock), false, {},
                             "elements per block (the last block of a tensor may be shorter)"});
  return params;
}

std::size_t block_count(std::size_t n, std::size_t block) { return (n + block - 1) / block; }

class BlockTopKCompressor final : public ErrorFeedbackCompressor {
 public:
  explicit BlockTopKCompressor(const Params& params)
      : ErrorFeedbackCompressor("blocktopk", payload::CodecId::kBlockTopK, blocktopk_compressor_info().traits,
                                blocktopk_params(), params),
        ratio_(params.get_float("ratio")),
        block_(static_cast<std::size_t>(params.get_int("block"))) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    // Checked here, before anything is allocated: compress() asks for this bound before it creates any state (a
    // 2^31-element tensor with ef=on used to allocate its residual first), and callers size buffers with it.
    sparse::check_index_limit("blocktopk", numel);
    const std::size_t kb = kernels::k_of_ratio(ratio_, block_count(numel, block_));
    return payload::kHeaderBytes + payload::align_up(kb * sizeof(std::int32_t)) +
           std::min(kb * block_, numel) * sizeof(float);
  }

 protected:
  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("blocktopk", args.ctx->name, n);
    const std::size_t blocks = block_count(n, block_);
    const std::size_t kb = kernels::k_of_ratio(ratio_, blocks);
    // Pass 1 (fused with error feedback): squared L2 norm of each block, summed in element order in f32 with fused
    // multiply-adds, and its
    // key (the norm's bits; NaN ranks above inf). Chunks are whole blocks.
    norm_keys_.resize(blocks);
    float* residual = args.residual;
    const float* grad = args.grad;
    const std::size_t blocks_per_chunk = std::max<std::size_t>(1, kernels::kParallelChunk / block_);
    kernels::parallel_chunks(blocks, blocks_per_chunk, args.threads,
                             [&](std::size_t, std::size_t first, std::size_t last) {
                               for (std::size_t b = first; b < last; ++b) {
                                 const std::size_t begin = b * block_, end = std::min(n, begin + block_);
                                 float sum = 0.0f;
                                 for (std::size_t i = begin; i < end; ++i) {
                                   float v = grad[i];
                                   if (residual != nullptr) {
                                     v = kernels::ef_accumulate(residual[i], v);
                                     residual[i] = v;
                                   }
                                   sum = kernels::block_norm_step(sum, v);
                                 }
                                 norm_keys_[b] = kernels::magnitude_key(sum);
                               }
                             });
    const float* values = residual != nullptr ? residual : grad;
    all_blocks_.resize(blocks);
    std::iota(all_blocks_.begin(), all_blocks_.end(), 0u);
    kernels::select_among([this](std::uint32_t b) { return norm_keys_[b]; },
                          std::span<const std::uint32_t>(all_blocks_), kb, selected_);

    std::size_t value_count = 0;
    for (const std::uint32_t b : selected_) value_count += std::min(n, (b + 1) * block_) - b * block_;
    payload::Header header;
    header.codec = payload::CodecId::kBlockTopK;
    header.numel = n;
    header.dtype = args.original_dtype;
    header.param0 = static_cast<std::uint32_t>(block_);
    header.param1 = static_cast<std::uint32_t>(selected_.size());
    header.section_count = 2;
    header.section_bytes[0] = selected_.size() * sizeof(std::int32_t);
    header.section_bytes[1] = value_count * sizeof(float);
    const std::size_t total = payload::write_header(header, out);
    auto* ids = reinterpret_cast<std::int32_t*>(out.data() + payload::section_offset(header, 0));
    auto* body = reinterpret_cast<float*>(out.data() + payload::section_offset(header, 1));
    const float scale = args.ctx->prescale;
    std::size_t written = 0;
    for (std::size_t j = 0; j < selected_.size(); ++j) {
      const std::size_t b = selected_[j];
      ids[j] = static_cast<std::int32_t>(b);
      const std::size_t begin = b * block_, end = std::min(n, begin + block_);
      for (std::size_t i = begin; i < end; ++i) {
        const float v = values[i];
        const float wire = kernels::wire_f32(v * scale);  // one NaN on the wire (kernels/wire_nan.cuh)
        body[written++] = wire;
        if (residual != nullptr) residual[i] = scale == 1.0f ? v - wire : v - wire / scale;
      }
    }
    stats.selected = value_count;
    return total;
  }

  void validate(const payload::View& view, std::size_t numel) const override {
    const sparse::BlockIds ids = sparse::check_blocktopk_ids(view, numel);
    sparse::validate_increasing_indices(view.sections[0], ids.count, ids.blocks, "blocktopk");
    std::int32_t last = 0;
    if (ids.count > 0) std::memcpy(&last, view.sections[0].data() + (ids.count - 1) * sizeof(last), sizeof(last));
    sparse::check_blocktopk_values(view, ids, numel, static_cast<std::size_t>(last));
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    validate(view, numel);
    const std::size_t block = view.header.param0;
    const std::size_t kb = view.sections[0].size() / sizeof(std::int32_t);
    std::vector<std::int32_t> ids(kb);
    if (kb > 0) std::memcpy(ids.data(), view.sections[0].data(), kb * sizeof(std::int32_t));
    if (!accumulate && numel > 0) std::memset(out, 0, numel * sizeof(float));
    const std::byte* body = view.sections[1].data();
    std::size_t read = 0;
    for (const std::int32_t b : ids) {
      const std::size_t begin = static_cast<std::size_t>(b) * block, end = std::min(numel, begin + block);
      const std::size_t count = end - begin;
      if (accumulate) {
        for (std::size_t i = 0; i < count; ++i) {
          float value;
          std::memcpy(&value, body + (read + i) * sizeof(float), sizeof(float));
          out[begin + i] += value;
        }
      } else {
        std::memcpy(out + begin, body + read * sizeof(float), count * sizeof(float));
      }
      read += count;
    }
  }

 private:
  double ratio_;
  std::size_t block_;
  std::vector<std::uint32_t> norm_keys_, all_blocks_, selected_;
};

}  // namespace

CompressorInfo blocktopk_compressor_info() {
  CompressorInfo info;
  info.name = "blocktopk";
  info.summary = "block top-k with error feedback: the largest-norm blocks sent whole (block ids + values)";
  info.traits.gatherable = true;
  info.traits.lossy = true;
  info.traits.wire_dtype = DType::kF32;
  info.params = blocktopk_params();
  info.factory = [](const Params& params) { return std::make_unique<BlockTopKCompressor>(params); };
  return info;
}

}  // namespace gradcomp
