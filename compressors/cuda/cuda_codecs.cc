// make_cuda_codec: the CUDA backend of a codec, from the codec table (CUDA builds only).
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "compressors/framework/codec_table.h"
#include "compressors/cuda/cuda_codec.h"

namespace gradcomp {

std::unique_ptr<CudaCodec> make_cuda_codec(payload::CodecId codec, const Params& params) {
  const CodecRow* row = codec_row(codec);
  return row != nullptr && row->cuda != nullptr ? row->cuda(codec, params) : nullptr;
}

}  // namespace gradcomp
#endif
