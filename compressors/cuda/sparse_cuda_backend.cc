// CUDA backends of the sparsifiers: topk (compressors/codecs/sparse_payload.h's (index, value) format), randomk, blocktopk;
// dgc's is compressors/cuda/dgc_cuda_backend.cc.
// The selection is kernels/sparse_cuda.cu's exact radix select, which picks the same elements as the CPU's
// compressors/codecs/topk_select.cc (larger magnitude key first, lower index on ties), so the payloads are identical.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/cuda/sparse_cuda_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "compressors/cuda/cuda_codec.h"
#include "compressors/codecs/dgc.h"
#include "compressors/codecs/randomk.h"
#include "compressors/framework/sparse_checks.h"
#include "compressors/codecs/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/common_cuda.h"
#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#include "kernels/randomk_cuda.h"
#include "kernels/sparse_cuda.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp {
namespace {

using sparse::index_value_header;

class TopKCudaCodec final : public CudaCodec {
 public:
  TopKCudaCodec(std::size_t fixed_k, double ratio, sparse::ValueType type)
      : fixed_k_(fixed_k), ratio_(ratio), type_(type) {}

  std::size_t workspace_bytes(std::size_t numel) const override { return kernels::topk_workspace_bytes(numel); }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("topk", args.ctx->name, n);
    const std::size_t k = k_for(n);
    const payload::Header header = index_value_header(payload::CodecId::kTopK, n, args.original_dtype, k, type_);
    write_header_device(header, out, args.stream);
    auto* indices = reinterpret_cast<std::int32_t*>(out + payload::section_offset(header, 0));
    std::byte* values_out = out + payload::section_offset(header, 1);
    stats.selected = k;
    if (n == 0) return payload::total_bytes(header);
    const bool ef = args.buffers[0] != nullptr;
    float* values = ef ? args.next[0] : const_cast<float*>(args.grad);  // ef: v = r + g, written by the first pass
    const auto threshold = kernels::topk_threshold(args.grad, args.buffers[0], values, n, k, args.workspace,
                                                   args.counters, args.stream);
    kernels::topk_compact(values, n, threshold, indices, args.workspace, args.stream);
    kernels::launch_sparse_gather(values, indices, k, args.ctx->prescale, type_ == sparse::ValueType::kF16,
                                  values_out, ef ? args.next[0] : nullptr, args.counters, args.stream);
    return payload::total_bytes(header);
  }

  bool validate(const CudaDecodeArgs& args) override { return validate_index_value_cuda(args, "topk"); }
  void checked(const CudaDecodeArgs& args, int flag, std::uint64_t) const override {
    checked_index_value_cuda(args, flag, "topk");
  }
  void decode(const CudaDecodeArgs& args) override { decode_index_value_cuda(args); }

 private:
  std::size_t k_for(std::size_t n) const {
    if (n == 0) return 0;
    if (fixed_k_ > 0) return std::min(fixed_k_, n);
    return static_cast<std::size_t>(kernels::k_of_ratio(ratio_, n));
  }

  std::size_t fixed_k_;
  double ratio_;
  sparse::ValueType type_;
};

// randomk: the positions are Floyd's (randomk_indices() on the host), decided in parallel on the device
// (kernels/randomk_cuda.h: the same bits), for the encode and again for each decode; the GPU also does the error
// feedback pass, the gather and the residual update. The positions of the last (seed, key, step, n, k) are kept in a
// device buffer: the decodes of one step (every rank's payload of a tensor) reuse the encode's.
class RandomKCudaCodec final : public CudaCodec {
 public:
  RandomKCudaCodec(double ratio, std::uint64_t seed) : ratio_(ratio), seed_(seed) {}

  std::size_t workspace_bytes(std::size_t numel) const override {
    return kernels::randomk_workspace_bytes(numel, kernels::k_of_ratio(ratio_, numel));
  }
  std::size_t decode_workspace_bytes(std::size_t numel) const override { return workspace_bytes(numel); }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("randomk", args.ctx->name, n);
    const std::size_t k = kernels::k_of_ratio(ratio_, n);
    const payload::Header header = sparse::randomk_header(n, args.original_dtype, k);
    write_header_device(header, out, args.stream);
    const std::uint64_t stream_words[4] = {seed_, args.tensor_key, args.ctx->step, k};
    kernels::launch_write_bytes(out + payload::section_offset(header, 0), stream_words, sizeof(stream_words),
                                args.stream);
    const bool ef = args.buffers[0] != nullptr;
    kernels::launch_ef_accumulate(args.grad, args.buffers[0], ef ? args.next[0] : nullptr, n, args.counters,
                                  args.stream);
    const std::int32_t* indices = positions(stream_words, n, args.workspace, args.stream);
    kernels::launch_sparse_gather(ef ? args.next[0] : args.grad, indices, k, args.ctx->prescale, false,
                                  out + payload::section_offset(header, 1), ef ? args.next[0] : nullptr,
                                  args.counters, args.stream);
    stats.selected = k;
    return payload::total_bytes(header);
  }

  bool validate(const CudaDecodeArgs& args) override {
    const std::size_t numel = args.numel;
    const std::uint64_t k = sparse::check_randomk_layout(*args.view, args.lead, numel);
    // The decode workspace is sized for this codec's k (a payload of another ratio is another spec).
    GRADCOMP_CHECK_AS(CorruptPayload, k == kernels::k_of_ratio(ratio_, numel),
                      "randomk payload with k = {} for {} elements, where this codec (ratio {}) sends {}", k, numel,
                      ratio_, kernels::k_of_ratio(ratio_, numel));
    return false;  // the positions are regenerated, never read: nothing to check on the device
  }

  void decode(const CudaDecodeArgs& args) override {
    std::uint64_t stream_words[4];
    std::memcpy(stream_words, args.lead.data(), sizeof(stream_words));
    const std::int32_t* indices = positions(stream_words, args.numel, args.workspace, args.stream);
    kernels::launch_sparse_scatter(indices, args.view->sections[1].data(), false, stream_words[3], args.out,
                                   args.numel, args.accumulate, args.stream);
  }

 private:
  static constexpr std::size_t kStreamSectionBytes = sparse::kRandomKStreamBytes;

  // The positions of (seed, key, step, k) in a tensor of n elements, on the current device, in stream order: the kept
  // ones when they match (every call of this compressor on a device is ordered after the previous one, see
  // compressors/cuda/cuda_path.h's DeviceScratch), else computed into the kept buffer.
  const std::int32_t* positions(const std::uint64_t (&words)[4], std::uint64_t n, void* workspace,
                                cudaStream_t stream) {
    int device = 0;
    GRADCOMP_CUDA_CHECK(cudaGetDevice(&device));
    const std::array<std::uint64_t, 6> id = {words[0], words[1], words[2], n, words[3],
                                             static_cast<std::uint64_t>(device)};
    if (!have_ || id != id_) {
      have_ = false;
      if (id[5] != id_[5]) kept_.release();  // the buffer lives on the device it was made on
      kept_.reserve(std::max<std::uint64_t>(words[3], 1) * sizeof(std::int32_t));
      kernels::launch_randomk_indices(words[0], words[1], words[2], n, words[3], kept_.as<std::int32_t>(), workspace,
                                      stream);
      id_ = id;
      have_ = true;
    }
    return kept_.as<const std::int32_t>();
  }

  double ratio_;
  std::uint64_t seed_;
  kernels::DeviceBuffer kept_;
  std::array<std::uint64_t, 6> id_{};
  bool have_ = false;
};

// blocktopk: block norms (one sequential fmaf chain per block, as on the CPU), the exact radix select of topk over
// the blocks' norm keys (same order: larger key first, lower block id on ties), block ids written ascending straight
// into the payload, then a gather of the whole blocks. The value count depends on whether the last (short) block was
// chosen, so the host reads the last id before writing the header (one extra synchronization).
class BlockTopKCudaCodec final : public CudaCodec {
 public:
  BlockTopKCudaCodec(double ratio, std::size_t block) : ratio_(ratio), block_(block) {}

  std::size_t workspace_bytes(std::size_t numel) const override {
    const std::size_t blocks = block_count(numel);
    return keys_bytes(blocks) + 256 + kernels::topk_workspace_bytes(blocks);
  }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    sparse::check_indexable("blocktopk", args.ctx->name, n);
    const std::size_t blocks = block_count(n);
    const std::size_t kb = kernels::k_of_ratio(ratio_, blocks);
    auto* base = static_cast<std::byte*>(args.workspace);
    auto* keys = reinterpret_cast<std::uint32_t*>(base);
    auto* scratch_counters = reinterpret_cast<kernels::DeviceCounters*>(base + keys_bytes(blocks));
    void* select_workspace = base + keys_bytes(blocks) + 256;
    const bool ef = args.buffers[0] != nullptr;
    const float* values = ef ? args.next[0] : args.grad;
    // The select's counters (non-finite keys, never read) must not be uninitialized memory (initcheck).
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(scratch_counters, 0, sizeof(kernels::DeviceCounters), args.stream));
    kernels::launch_block_norms(args.grad, args.buffers[0], ef ? args.next[0] : nullptr, n, block_, keys,
                                args.counters, args.stream);
    auto* ids = reinterpret_cast<std::int32_t*>(out + payload::kHeaderBytes);
    std::size_t value_count = 0;
    if (kb > 0) {
      // The keys are non-negative float bit patterns, so the top-k select of "values" with those bits ranks blocks by
      // their norm key exactly (magnitude_key of such a pattern is the pattern itself).
      auto* key_values = reinterpret_cast<float*>(keys);
      const auto threshold = kernels::topk_threshold(key_values, nullptr, key_values, blocks, kb, select_workspace,
                                                     scratch_counters, args.stream);
      kernels::topk_compact(key_values, blocks, threshold, ids, select_workspace, args.stream);
      std::int32_t last = 0;
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&last, ids + kb - 1, sizeof(last), cudaMemcpyDeviceToHost, args.stream));
      kernels::synchronize_stream(args.stream);
      value_count = kb * block_;
      if (static_cast<std::size_t>(last) == blocks - 1) value_count -= blocks * block_ - n;
    }
    payload::Header header;
    header.codec = payload::CodecId::kBlockTopK;
    header.numel = n;
    header.dtype = args.original_dtype;
    header.param0 = static_cast<std::uint32_t>(block_);
    header.param1 = static_cast<std::uint32_t>(kb);
    header.section_count = 2;
    header.section_bytes[0] = kb * sizeof(std::int32_t);
    header.section_bytes[1] = value_count * sizeof(float);
    write_header_device(header, out, args.stream);
    kernels::launch_block_gather(values, ids, kb, block_, n, args.ctx->prescale,
                                 reinterpret_cast<float*>(out + payload::section_offset(header, 1)),
                                 ef ? args.next[0] : nullptr, args.stream);
    stats.selected = value_count;
    return payload::total_bytes(header);
  }

  bool validate(const CudaDecodeArgs& args) override {
    const auto& sections = args.view->sections;
    const sparse::BlockIds block_ids = sparse::check_blocktopk_ids(*args.view, args.numel);
    const std::size_t kb = block_ids.count, blocks = block_ids.blocks;
    const auto* ids = reinterpret_cast<const std::int32_t*>(sections[0].data());
    kernels::launch_validate_indices(ids, kb, blocks, args.error_flag, args.stream);
    // The value count depends on whether the short last block was sent: the last id comes back with the flag.
    if (kb > 0) {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(args.check_word, ids + kb - 1, sizeof(std::int32_t),
                                          cudaMemcpyDeviceToDevice, args.stream));
    }
    return true;
  }

  void checked(const CudaDecodeArgs& args, int flag, std::uint64_t word) const override {
    const sparse::BlockIds ids = sparse::check_blocktopk_ids(*args.view, args.numel);
    sparse::check_indices_flag(flag == 0, "blocktopk", ids.blocks, ids.count);
    sparse::check_blocktopk_values(*args.view, ids, args.numel, static_cast<std::uint32_t>(word));
  }

  void decode(const CudaDecodeArgs& args) override {
    const auto& sections = args.view->sections;
    const std::size_t kb = sections[0].size() / sizeof(std::int32_t);
    kernels::launch_block_scatter(reinterpret_cast<const std::int32_t*>(sections[0].data()), kb,
                                  args.view->header.param0, args.numel,
                                  reinterpret_cast<const float*>(sections[1].data()), args.out, args.accumulate,
                                  args.stream);
  }

 private:
  std::size_t block_count(std::size_t n) const { return (n + block_ - 1) / block_; }
  static std::size_t keys_bytes(std::size_t blocks) {
    return (std::max<std::size_t>(blocks, 1) * sizeof(std::uint32_t) + 255) / 256 * 256;
  }

  double ratio_;
  std::size_t block_;
};


}  // namespace

bool validate_index_value_cuda(const CudaDecodeArgs& args, std::string_view codec) {
  const std::size_t k = sparse::check_index_value_layout(*args.view, codec, args.numel);
  kernels::launch_validate_indices(reinterpret_cast<const std::int32_t*>(args.view->sections[0].data()), k,
                                   args.numel, args.error_flag, args.stream);
  return true;
}

void checked_index_value_cuda(const CudaDecodeArgs& args, int flag, std::string_view codec) {
  sparse::check_indices_flag(flag == 0, codec, args.numel, args.view->sections[0].size() / sizeof(std::int32_t));
}

void decode_index_value_cuda(const CudaDecodeArgs& args) {
  const auto& sections = args.view->sections;
  const auto type = static_cast<sparse::ValueType>(args.view->header.param0);
  kernels::launch_sparse_scatter(reinterpret_cast<const std::int32_t*>(sections[0].data()), sections[1].data(),
                                 type == sparse::ValueType::kF16, sections[0].size() / sizeof(std::int32_t), args.out,
                                 args.numel, args.accumulate, args.stream);
}

std::unique_ptr<CudaCodec> make_sparse_cuda_codec(payload::CodecId codec, const Params& params) {
  switch (codec) {
    case payload::CodecId::kTopK: {
      const std::size_t fixed_k = params.has("k") ? static_cast<std::size_t>(params.get_int("k")) : 0;
      const double ratio = params.has("ratio") ? params.get_float("ratio") : 0.01;
      const auto type = params.get_string("values") == "f16" ? sparse::ValueType::kF16 : sparse::ValueType::kF32;
      return std::make_unique<TopKCudaCodec>(fixed_k, ratio, type);
    }
    case payload::CodecId::kRandomK:
      return std::make_unique<RandomKCudaCodec>(params.get_float("ratio"),
                                                static_cast<std::uint64_t>(params.get_int("seed")));
    case payload::CodecId::kBlockTopK:
      return std::make_unique<BlockTopKCudaCodec>(params.get_float("ratio"),
                                                  static_cast<std::size_t>(params.get_int("block")));
    case payload::CodecId::kDgc:
      return make_dgc_cuda_codec(params);
    default:
      return nullptr;
  }
}

}  // namespace gradcomp
#endif
