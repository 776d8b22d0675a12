// The list of codecs with a CUDA backend (CUDA builds only). One line per codec family.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/cuda_codec.h"
#include "compressors/dense_cuda.h"
#include "compressors/quantize_cuda.h"
#include "compressors/sparse_cuda.h"

namespace gradcomp {

std::unique_ptr<CudaCodec> make_cuda_codec(payload::CodecId codec, const Params& params) {
  if (auto dense = make_dense_cuda_codec(codec, params)) return dense;
  if (auto quantize = make_quantize_cuda_codec(codec, params)) return quantize;
  if (auto sparse = make_sparse_cuda_codec(codec, params)) return sparse;
  return nullptr;
}

}  // namespace gradcomp
#endif
