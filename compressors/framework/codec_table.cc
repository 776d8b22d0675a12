#include "compressors/framework/codec_table.h"

#include <array>

#include "compressors/codecs/blocktopk.h"
#include "compressors/codecs/bf16.h"
#include "compressors/codecs/dgc.h"
#include "compressors/codecs/fp16.h"
#include "compressors/codecs/none.h"
#include "compressors/codecs/onebit.h"
#include "compressors/codecs/powersgd.h"
#include "compressors/codecs/qsgd.h"
#include "compressors/codecs/randomk.h"
#include "compressors/codecs/terngrad.h"
#include "compressors/codecs/topk.h"
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/cuda/dense_cuda_backend.h"
#include "compressors/cuda/quantize_cuda_backend.h"
#include "compressors/cuda/sparse_cuda_backend.h"
#define GRADCOMP_CUDA_BACKEND(factory) &factory
#else
#define GRADCOMP_CUDA_BACKEND(factory) nullptr
#endif

namespace gradcomp {

namespace {
using payload::CodecId;

const std::array<CodecRow, 11> kRows = {{
    {CodecId::kNone, "none", &none_compressor_info, GRADCOMP_CUDA_BACKEND(make_dense_cuda_codec), ""},
    {CodecId::kFp16, "fp16", &fp16_compressor_info, GRADCOMP_CUDA_BACKEND(make_dense_cuda_codec), ""},
    {CodecId::kBf16, "bf16", &bf16_compressor_info, GRADCOMP_CUDA_BACKEND(make_dense_cuda_codec), ""},
    {CodecId::kQsgd, "qsgd", &qsgd_compressor_info, GRADCOMP_CUDA_BACKEND(make_quantize_cuda_codec), "bits"},
    {CodecId::kTernGrad, "terngrad", &terngrad_compressor_info, GRADCOMP_CUDA_BACKEND(make_quantize_cuda_codec), ""},
    {CodecId::kOneBit, "onebit", &onebit_compressor_info, GRADCOMP_CUDA_BACKEND(make_quantize_cuda_codec), ""},
    {CodecId::kTopK, "topk", &topk_compressor_info, GRADCOMP_CUDA_BACKEND(make_sparse_cuda_codec), "ratio"},
    {CodecId::kRandomK, "randomk", &randomk_compressor_info, GRADCOMP_CUDA_BACKEND(make_sparse_cuda_codec), "ratio"},
    {CodecId::kBlockTopK, "blocktopk", &blocktopk_compressor_info, GRADCOMP_CUDA_BACKEND(make_sparse_cuda_codec),
     "ratio"},
    {CodecId::kDgc, "dgc", &dgc_compressor_info, GRADCOMP_CUDA_BACKEND(make_sparse_cuda_codec), "ratio"},
    // PowerSGD has no CudaCodec: its device path is LowRankOps on CUDA (compressors/cuda/lowrank_ops_cuda.cc).
    {CodecId::kPowerSgd, "powersgd", &powersgd_compressor_info, nullptr, "rank"},
}};

}  // namespace

std::span<const CodecRow> builtin_codecs() { return kRows; }

const CodecRow* codec_row(payload::CodecId id) {
  for (const CodecRow& row : kRows) {
    if (row.id == id) return &row;
  }
  return nullptr;
}

}  // namespace gradcomp
