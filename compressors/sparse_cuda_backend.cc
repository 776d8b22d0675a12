// CUDA backends of the sparsifiers: topk (compressors/sparse_payload.h's (index, value) format), randomk, blocktopk;
// dgc's is compressors/dgc_cuda_backend.cc.
// The selection is kernels/sparse_cuda.cu's exact radix select, which picks the same elements as the CPU's
// kernels/topk_select.cc (larger magnitude key first, lower index on ties), so the payloads are identical.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/sparse_cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "compressors/cuda_codec.h"
#include "compressors/dgc.h"
#include "compressors/randomk.h"
#include "compressors/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/common_cuda.h"
#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#include "kernels/sparse_cuda.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp {
namespace {

constexpr std::size_t kMaxIndexable = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

using sparse::index_value_header;


class TopKCudaCodec final : public CudaCodec {
 public:
  TopKCudaCodec(std::size_t fixed_k, double ratio, sparse::ValueType type)
      : fixed_k_(fixed_k), ratio_(ratio), type_(type) {}

  std::size_t workspace_bytes(std::size_t numel) const override { return kernels::topk_workspace_bytes(numel); }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    GRADCOMP_CHECK(n <= kMaxIndexable, "compressor 'topk': tensor '{}' has {} elements; int32 indices address at most {}",
                   args.ctx->name, n, kMaxIndexable);
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

  void decode(const CudaDecodeArgs& args) override { decode_index_value_cuda(args, "topk"); }

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

// randomk: the positions come from Floyd's algorithm, which is sequential, so they are drawn on the host by the CPU
// codec's own randomk_indices() (same bits by construction) and uploaded (k int32 per call); the GPU does the error
// feedback pass, the gather and the residual update.
class RandomKCudaCodec final : public CudaCodec {
 public:
  RandomKCudaCodec(double ratio, std::uint64_t seed) : ratio_(ratio), seed_(seed) {}

  std::size_t workspace_bytes(std::size_t numel) const override {
    return std::max<std::size_t>(kernels::k_of_ratio(ratio_, numel), 1) * sizeof(std::int32_t);
  }
  std::size_t decode_workspace_bytes(std::size_t numel) const override {
    return std::max<std::size_t>(numel, 1) * sizeof(std::int32_t);
  }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    GRADCOMP_CHECK(n <= kMaxIndexable, "compressor 'randomk': tensor '{}' has {} elements (at most {} supported)",
                   args.ctx->name, n, kMaxIndexable);
    const std::size_t k = kernels::k_of_ratio(ratio_, n);
    randomk_indices(seed_, args.tensor_key, args.ctx->step, n, k, indices_);
    const payload::Header header = sparse::randomk_header(n, args.original_dtype, k);
    write_header_device(header, out, args.stream);
    const std::uint64_t stream_words[4] = {seed_, args.tensor_key, args.ctx->step, k};
    kernels::launch_write_bytes(out + payload::section_offset(header, 0), stream_words, sizeof(stream_words),
                                args.stream);
    const bool ef = args.buffers[0] != nullptr;
    kernels::launch_ef_accumulate(args.grad, args.buffers[0], ef ? args.next[0] : nullptr, n, args.counters,
                                  args.stream);
    auto* device_indices = static_cast<std::int32_t*>(args.workspace);
    upload_indices(device_indices, k, args.stream);
    kernels::launch_sparse_gather(ef ? args.next[0] : args.grad, device_indices, k, args.ctx->prescale, false,
                                  out + payload::section_offset(header, 1), ef ? args.next[0] : nullptr,
                                  args.counters, args.stream);
    // pinned_ is rewritten only after the caller's stream synchronization (compress_cuda reads the counters).
    stats.selected = k;
    return payload::total_bytes(header);
  }

  void decode(const CudaDecodeArgs& args) override {
    const payload::Header& header = args.view->header;
    const auto& sections = args.view->sections;
    const std::size_t numel = args.numel;
    GRADCOMP_CHECK_AS(CorruptPayload,
                      header.section_count == 2 && header.flags == 0 && header.param0 == 0 &&
                          sections[0].size() == kStreamSectionBytes,
                      "corrupt randomk payload: {} sections, flags {:#x}, param0 {}, stream section {} bytes "
                      "(expected 2, 0, 0, {})",
                      header.section_count, header.flags, header.param0, sections[0].size(), kStreamSectionBytes);
    GRADCOMP_CHECK_AS(CorruptPayload, numel <= kMaxIndexable, "corrupt randomk payload: {} elements (at most {})",
                      numel, kMaxIndexable);
    std::uint64_t stream_words[4];
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(stream_words, sections[0].data(), sizeof(stream_words), cudaMemcpyDeviceToHost,
                                        args.stream));
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(args.stream));
    const std::uint64_t k = stream_words[3];
    GRADCOMP_CHECK_AS(CorruptPayload, k <= numel && header.param1 == k && sections[1].size() == k * sizeof(float),
                      "corrupt randomk payload: k = {} (header {}) with {} value bytes for a tensor of {} elements",
                      k, header.param1, sections[1].size(), numel);
    randomk_indices(stream_words[0], stream_words[1], stream_words[2], numel, k, indices_);
    auto* device_indices = static_cast<std::int32_t*>(args.workspace);
    upload_indices(device_indices, k, args.stream);
    kernels::launch_sparse_scatter(device_indices, sections[1].data(), false, k, args.out, numel, args.accumulate,
                                   args.stream);
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(args.stream));  // pinned_ is rewritten by the next call
  }

 private:
  static constexpr std::size_t kStreamSectionBytes = sparse::kRandomKStreamBytes;

  // Copies indices_[0, k) to the device through page-locked memory (a copy from the pageable vector would be staged
  // synchronously by the driver, serializing the host with the stream).
  void upload_indices(std::int32_t* device_indices, std::size_t k, cudaStream_t stream) {
    if (k == 0) return;
    pinned_.reserve(k * sizeof(std::int32_t));
    std::memcpy(pinned_.as<void>(), indices_.data(), k * sizeof(std::int32_t));
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(device_indices, pinned_.as<void>(), k * sizeof(std::int32_t),
                                        cudaMemcpyHostToDevice, stream));
  }

  double ratio_;
  std::uint64_t seed_;
  std::vector<std::uint32_t> indices_;
  kernels::PinnedBuffer pinned_;
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
    GRADCOMP_CHECK(n <= kMaxIndexable, "compressor 'blocktopk': tensor '{}' has {} elements (at most {} supported)",
                   args.ctx->name, n, kMaxIndexable);
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
      GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(args.stream));
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

  void decode(const CudaDecodeArgs& args) override {
    const payload::Header& header = args.view->header;
    const auto& sections = args.view->sections;
    const std::size_t numel = args.numel;
    GRADCOMP_CHECK_AS(CorruptPayload,
                      header.section_count == 2 && header.flags == 0 && header.param0 >= 1 &&
                          header.param0 <= kMaxBlock && numel <= kMaxIndexable,
                      "corrupt blocktopk payload: {} sections, flags {:#x}, block {}, {} elements",
                      header.section_count, header.flags, header.param0, numel);
    const std::size_t block = header.param0;
    const std::size_t blocks = (numel + block - 1) / block;
    const std::size_t id_bytes = sections[0].size();
    GRADCOMP_CHECK_AS(CorruptPayload,
                      id_bytes % sizeof(std::int32_t) == 0 && id_bytes / 4 <= blocks && header.param1 == id_bytes / 4,
                      "corrupt blocktopk payload: id section of {} bytes (header says {} blocks) for {} blocks",
                      id_bytes, header.param1, blocks);
    const std::size_t kb = id_bytes / sizeof(std::int32_t);
    const auto* ids = reinterpret_cast<const std::int32_t*>(sections[0].data());
    kernels::launch_validate_indices(ids, kb, blocks, args.error_flag, args.stream);
    int bad = 0;
    std::int32_t last = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&bad, args.error_flag, sizeof(int), cudaMemcpyDeviceToHost, args.stream));
    if (kb > 0) {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&last, ids + kb - 1, sizeof(last), cudaMemcpyDeviceToHost, args.stream));
    }
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(args.stream));
    GRADCOMP_CHECK_AS(CorruptPayload, bad == 0,
                      "corrupt blocktopk payload: block ids are not strictly increasing and in [0, {}) ({} ids)",
                      blocks, kb);
    std::size_t expected = kb * block;
    if (kb > 0 && static_cast<std::size_t>(last) == blocks - 1) expected -= blocks * block - numel;
    GRADCOMP_CHECK_AS(CorruptPayload, sections[1].size() == expected * sizeof(float),
                      "corrupt blocktopk payload: value section has {} bytes, {} values ({} bytes) expected",
                      sections[1].size(), expected, expected * sizeof(float));
    kernels::launch_block_scatter(ids, kb, block, numel, reinterpret_cast<const float*>(sections[1].data()), args.out,
                                  args.accumulate, args.stream);
  }

 private:
  static constexpr std::size_t kMaxBlock = std::size_t{1} << 24;
  std::size_t block_count(std::size_t n) const { return (n + block_ - 1) / block_; }
  static std::size_t keys_bytes(std::size_t blocks) {
    return (std::max<std::size_t>(blocks, 1) * sizeof(std::uint32_t) + 255) / 256 * 256;
  }

  double ratio_;
  std::size_t block_;
};


}  // namespace

void decode_index_value_cuda(const CudaDecodeArgs& args, std::string_view codec) {
  const payload::Header& header = args.view->header;
  const auto& sections = args.view->sections;
  GRADCOMP_CHECK_AS(CorruptPayload, header.section_count == 2 && header.flags == 0,
                    "corrupt {} payload: {} sections and flags {:#x} (expected 2 sections, flags 0)", codec,
                    header.section_count, header.flags);
  GRADCOMP_CHECK_AS(CorruptPayload, header.param0 <= 1, "corrupt {} payload: value type {} (0 = f32, 1 = f16)", codec,
                    header.param0);
  const auto type = static_cast<sparse::ValueType>(header.param0);
  const std::size_t index_bytes = sections[0].size();
  GRADCOMP_CHECK_AS(CorruptPayload, index_bytes % sizeof(std::int32_t) == 0,
                    "corrupt {} payload: index section of {} bytes is not a whole number of int32", codec,
                    index_bytes);
  const std::size_t k = index_bytes / sizeof(std::int32_t);
  GRADCOMP_CHECK_AS(CorruptPayload, k <= args.numel && header.param1 == k,
                    "corrupt {} payload: {} indices (header says {}) for a tensor of {} elements", codec, k,
                    header.param1, args.numel);
  GRADCOMP_CHECK_AS(CorruptPayload, sections[1].size() == k * sparse::value_bytes(type),
                    "corrupt {} payload: value section has {} bytes, {} entries of {} bytes expected", codec,
                    sections[1].size(), k, sparse::value_bytes(type));
  const auto* indices = reinterpret_cast<const std::int32_t*>(sections[0].data());
  kernels::launch_validate_indices(indices, k, args.numel, args.error_flag, args.stream);
  int bad = 0;
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&bad, args.error_flag, sizeof(int), cudaMemcpyDeviceToHost, args.stream));
  GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(args.stream));
  GRADCOMP_CHECK_AS(CorruptPayload, bad == 0,
                    "corrupt {} payload: indices are not strictly increasing and in [0, {}) ({} entries)", codec,
                    args.numel, k);
  kernels::launch_sparse_scatter(indices, sections[1].data(), type == sparse::ValueType::kF16, k, args.out, args.numel,
                                 args.accumulate, args.stream);
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
