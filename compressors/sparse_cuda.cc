// CUDA backends of the sparsifiers: topk and dgc (compressors/sparse_payload.h's (index, value) format), randomk,
// blocktopk.
// The selection is kernels/sparse_cuda.cu's exact radix select, which picks the same elements as the CPU's
// kernels/topk_select.cc (larger magnitude key first, lower index on ties), so the payloads are identical.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/sparse_cuda.h"

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

// sparse::decode_index_value on the device: host checks of the header, a validation kernel, then the scatter.
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

// dgc: clipping factor and momentum correction on the device (the CPU's orders of summation), the sampled threshold
// (same Philox sample positions, the sample's exact k-th key by the radix select), the candidate count (one sync),
// and the CPU's three paths: accept the candidates, or fall back to the exact top-k (which is also what the CPU's
// "refine among candidates" path yields: with more than k candidates at or above T, the k best are all candidates).
class DgcCudaCodec final : public CudaCodec {
 public:
  DgcCudaCodec(double ratio, float momentum, bool nesterov, double clip, std::uint64_t warmup, double sample)
      : ratio_(ratio), momentum_(momentum), nesterov_(nesterov), clip_(clip), warmup_(warmup), sample_(sample) {}

  std::size_t workspace_bytes(std::size_t n) const override { return layout(n).total; }
  std::size_t decode_workspace_bytes(std::size_t) const override { return 0; }

  std::size_t encode(const CudaEncodeArgs& args, std::byte* out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    GRADCOMP_CHECK(n <= kMaxIndexable, "compressor 'dgc': tensor '{}' has {} elements (at most {} supported)",
                   args.ctx->name, n, kMaxIndexable);
    TensorState& state = *args.state;
    const Layout l = layout(n);
    auto* base = static_cast<std::byte*>(args.workspace);
    void* select = base + l.select;
    auto* candidates = reinterpret_cast<std::int32_t*>(base + l.candidates);
    auto* sample_keys = reinterpret_cast<float*>(base + l.samples);
    auto* partial = reinterpret_cast<double*>(base + l.partial);
    auto* clip_scale = reinterpret_cast<float*>(base + l.scale);
    auto* scratch_counters = reinterpret_cast<kernels::DeviceCounters*>(base + l.counters);
    auto* v_scratch = reinterpret_cast<float*>(base + l.v_scratch);
    // Counters of the selects and the masking gather (never read) must not be uninitialized memory (initcheck).
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(scratch_counters, 0, sizeof(kernels::DeviceCounters), args.stream));

    // The non-finite "skip" path has no residual: the CPU accumulates into zeros then.
    const float* v_in = args.buffers[0];
    float* v = args.next[0];
    if (v_in == nullptr) {
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(v_scratch, 0, std::max<std::size_t>(n, 1) * sizeof(float), args.stream));
      v_in = v_scratch;
      v = v_scratch;
    }
    const float* scale = nullptr;
    if (clip_ > 0.0 && n > 0) {
      kernels::launch_dgc_clip_scale(args.grad, n, clip_, partial, clip_scale, args.stream);
      scale = clip_scale;
    }
    kernels::launch_dgc_accumulate(args.grad, scale, args.buffers[1], v_in, args.next[1], v, n, momentum_, nesterov_,
                                   args.counters, args.stream);

    const double density = kernels::dgc_density(args.ctx->step, warmup_, ratio_);
    const std::size_t k = kernels::k_of_ratio(density, n);
    state.scalars.assign(kDgcScalarCount, 0.0);
    state.scalars[kDgcTargetK] = static_cast<double>(k);
    std::size_t selected = 0;
    auto exact = [&] {
      const auto threshold = kernels::topk_threshold(v, nullptr, v, n, k, select, scratch_counters, args.stream);
      kernels::topk_compact(v, n, threshold, candidates, select, args.stream);
      selected = k;
    };
    if (n > 0) {
      // compressors/dgc.cc: ceil(sample * length) draws per 64K chunk; sampled only when k < n and enough draws.
      const std::size_t chunk = 65536;
      const std::size_t full_draws = draws_for(chunk);
      const std::size_t chunks = (n + chunk - 1) / chunk;
      const std::size_t samples = (chunks - 1) * full_draws + draws_for(n - (chunks - 1) * chunk);
      if (!(k < n && samples >= kMinSample)) {
        exact();
        state.scalars[kDgcPath] = 2;
      } else {
        const auto stream = kernels::PhiloxStream::make(0, args.tensor_key ^ kernels::kDgcSampleStreamSalt,
                                                        args.ctx->step);
        kernels::launch_dgc_sample(v, n, stream, full_draws, samples, sample_keys, args.stream);
        const double scaled = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
        const std::size_t sample_k =
            std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(scaled)), 1, samples);
        const auto sampled = kernels::topk_threshold(sample_keys, nullptr, sample_keys, samples, sample_k, select,
                                                     scratch_counters, args.stream);
        const std::size_t count = kernels::collect_at_least(v, n, sampled.key, candidates, select, args.stream);
        float threshold_value;
        std::memcpy(&threshold_value, &sampled.key, sizeof(threshold_value));
        state.scalars[kDgcThreshold] = threshold_value;
        state.scalars[kDgcSampledCount] = static_cast<double>(count);
        const double lower = (1.0 - kTolerance) * static_cast<double>(k);
        const double upper = (1.0 + kTolerance) * static_cast<double>(k);
        if (static_cast<double>(count) > upper) {
          exact();
          state.scalars[kDgcPath] = 1;
        } else if (static_cast<double>(count) < lower) {
          exact();
          state.scalars[kDgcPath] = 2;
        } else {
          selected = count;
          state.scalars[kDgcPath] = 0;
        }
      }
    } else {
      state.scalars[kDgcPath] = 2;
    }
    const payload::Header header =
        index_value_header(payload::CodecId::kDgc, n, args.original_dtype, selected, sparse::ValueType::kF32);
    write_header_device(header, out, args.stream);
    auto* indices = reinterpret_cast<std::int32_t*>(out + payload::section_offset(header, 0));
    if (selected > 0) {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(indices, candidates, selected * sizeof(std::int32_t),
                                          cudaMemcpyDeviceToDevice, args.stream));
    }
    // Momentum-factor masking: what was sent leaves the accumulator (v - transmitted) and the momentum (0).
    kernels::launch_sparse_gather(v, indices, selected, args.ctx->prescale, false,
                                  out + payload::section_offset(header, 1), v, scratch_counters, args.stream);
    kernels::launch_zero_at(indices, selected, args.next[1], args.stream);
    stats.selected = selected;
    return payload::total_bytes(header);
  }

  void decode(const CudaDecodeArgs& args) override {
    GRADCOMP_CHECK_AS(CorruptPayload,
                      args.view->header.param0 == static_cast<std::uint32_t>(sparse::ValueType::kF32),
                      "corrupt dgc payload: value type {} (dgc sends f32 values, type 0)", args.view->header.param0);
    decode_index_value_cuda(args, "dgc");
  }

 private:
  static constexpr std::size_t kMinSample = 1024;  // compressors/dgc.cc
  static constexpr double kTolerance = 0.3;        // compressors/dgc.cc

  struct Layout {
    std::size_t select, candidates, samples, partial, scale, counters, v_scratch, total;
  };
  static std::size_t up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::size_t draws_for(std::size_t length) const {
    return static_cast<std::size_t>(std::ceil(sample_ * static_cast<double>(length)));
  }
  // Upper bound of the sample size (the draws of ceil(n / 64K) chunks).
  std::size_t sample_count(std::size_t n) const { return ((n + 65535) / 65536) * draws_for(65536); }
  Layout layout(std::size_t n) const {
    const std::size_t m = std::max<std::size_t>(n, 1);
    Layout l{};
    std::size_t at = 0;
    l.select = at, at += up(kernels::topk_workspace_bytes(m));
    l.candidates = at, at += up(m * sizeof(std::int32_t));
    l.samples = at, at += up(std::max<std::size_t>(sample_count(m), 1) * sizeof(float));
    l.partial = at, at += up(((m + 65535) / 65536) * sizeof(double));
    l.scale = at, at += 256;
    l.counters = at, at += 256;
    l.v_scratch = at, at += up(m * sizeof(float));
    l.total = at;
    return l;
  }

  double ratio_;
  float momentum_;
  bool nesterov_;
  double clip_;
  std::uint64_t warmup_;
  double sample_;
};

}  // namespace

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
      return std::make_unique<DgcCudaCodec>(
          params.get_float("ratio"), static_cast<float>(params.get_float("momentum")), params.get_bool("nesterov"),
          params.get_float("clip"), static_cast<std::uint64_t>(params.get_int("warmup_steps")),
          params.get_float("sample"));
    default:
      return nullptr;
  }
}

}  // namespace gradcomp
#endif
