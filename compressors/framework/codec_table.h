// The built-in codecs, one row each: registry name, payload id, the kind (parameters, traits, CPU factory), the
// CUDA backend factory and the parameter a Python positional argument sets. It replaces the parallel lists: the
// registry registers the rows, make_cuda_codec finds a backend by payload id, payload::codec_name names ids, and
// Python reads the positional parameter from list_compressors().
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "compressors/framework/payload.h"
#include "gradcomp/registry.h"

namespace gradcomp {

class CudaCodec;  // compressors/cuda/cuda_codec.h

// A CUDA backend factory: the codec's CudaCodec for these parameters (CUDA builds only).
using CudaFactory = std::unique_ptr<CudaCodec> (*)(payload::CodecId, const Params&);

struct CodecRow {
  payload::CodecId id;
  std::string_view name;
  CompressorInfo (*info)();  // name, summary, traits, parameters, CPU factory
  CudaFactory cuda;          // null in builds without CUDA
  std::string_view positional;
};

// Every built-in codec, in registration order.
std::span<const CodecRow> builtin_codecs();
// The row of payload id `id`, or null (kCustom and unknown ids).
const CodecRow* codec_row(payload::CodecId id);

}  // namespace gradcomp
