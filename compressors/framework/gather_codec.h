// An optional capability of a codec, found with dynamic_cast: the payload of a tensor made of several parts laid end
// to end (a fusion buffer's members) is written straight from the parts and decoded straight into them, so no buffer
// ever holds the laid-out tensor. Offered by codecs whose payload body holds one value per element at the element's
// place (the summable codecs: none, fp16, bf16): encoding and decoding part by part then gives the bits, the
// error-feedback state and the non-finite handling of compress()/decompress() of the laid-out tensor.
#pragma once

#include <cstddef>
#include <span>

#include "gradcomp/compressor.h"
#include "gradcomp/tensor.h"

namespace gradcomp {

class GatherCodec {
 public:
  virtual ~GatherCodec() = default;

  // Whether this instance offers the capability (a summable codec).
  virtual bool gathers() const = 0;

  // compress() of the tensor that `parts` make end to end, under `ctx` whose segments are one per part, in order
  // (segment s covers parts[s]). The parts are host memory of one dtype. Throws InvalidArgument as compress() does,
  // and when the codec does not gather or the parts do not match the segments (then nothing changed).
  virtual std::size_t compress_parts(std::span<const TensorView> parts, std::span<std::byte> out,
                                     const CompressContext& ctx) = 0;

  // decompress() of `payload` into the tensor that `parts` make end to end: each part receives its elements. The
  // payload is validated first (CorruptPayload, and then no part is written).
  virtual void decompress_parts(std::span<const std::byte> payload, std::span<const TensorView> parts,
                                DecodeMode mode) = 0;
};

}  // namespace gradcomp
