// CUDA backends of the sparsifiers whose payload is compressors/sparse_payload.h's (index, value) format: topk.
// The selection is kernels/sparse_cuda.cu's exact radix select, which picks the same elements as the CPU's
// kernels/topk_select.cc (larger magnitude key first, lower index on ties), so the payloads are identical.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/sparse_cuda.h"

#include <algorithm>
#include <limits>

#include "compressors/cuda_codec.h"
#include "compressors/sparse_payload.h"
#include "gradcomp/error.h"
#include "kernels/cuda_check.h"
#include "kernels/sparse_cuda.h"
#include "kernels/sparsify_ops.cuh"

namespace gradcomp {
namespace {

constexpr std::size_t kMaxIndexable = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

payload::Header index_value_header(payload::CodecId codec, std::uint64_t numel, DType dtype, std::size_t k,
                                   sparse::ValueType type) {
  payload::Header header;
  header.codec = codec;
  header.numel = numel;
  header.dtype = dtype;
  header.param0 = static_cast<std::uint32_t>(type);
  header.param1 = static_cast<std::uint32_t>(k);
  header.section_count = 2;
  header.section_bytes[0] = k * sizeof(std::int32_t);
  header.section_bytes[1] = k * sparse::value_bytes(type);
  return header;
}

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

}  // namespace

std::unique_ptr<CudaCodec> make_sparse_cuda_codec(payload::CodecId codec, const Params& params) {
  switch (codec) {
    case payload::CodecId::kTopK: {
      const std::size_t fixed_k = params.has("k") ? static_cast<std::size_t>(params.get_int("k")) : 0;
      const double ratio = params.has("ratio") ? params.get_float("ratio") : 0.01;
      const auto type = params.get_string("values") == "f16" ? sparse::ValueType::kF16 : sparse::ValueType::kF32;
      return std::make_unique<TopKCudaCodec>(fixed_k, ratio, type);
    }
    default:
      return nullptr;
  }
}

}  // namespace gradcomp
#endif
