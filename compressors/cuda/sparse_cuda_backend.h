// CUDA backends of the sparsifiers (CUDA builds only).
#pragma once

#include <memory>
#include <string_view>

#include "compressors/framework/payload.h"
#include "gradcomp/registry.h"

namespace gradcomp {

class CudaCodec;
struct CudaDecodeArgs;

// The backend of `codec` configured as the CPU codec parses `params`, or null when it has none.
std::unique_ptr<CudaCodec> make_sparse_cuda_codec(payload::CodecId codec, const Params& params);
// dgc's backend (compressors/cuda/dgc_cuda_backend.cc), configured from dgc's parsed parameters.
std::unique_ptr<CudaCodec> make_dgc_cuda_codec(const Params& params);

// sparse::decode_index_value on the device (topk, dgc), as CudaCodec's three rounds: host checks of the header
// (CorruptPayload) and the index validation kernel; the flag's verdict; the scatter into args.out.
bool validate_index_value_cuda(const CudaDecodeArgs& args, std::string_view codec);
void checked_index_value_cuda(const CudaDecodeArgs& args, int flag, std::string_view codec);
void decode_index_value_cuda(const CudaDecodeArgs& args);

}  // namespace gradcomp
