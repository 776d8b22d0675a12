// Helpers shared by the quantizing codecs (fp16, bf16, qsgd, terngrad, onebit): payload validation on decode,
// bucket bookkeeping and parallel chunking that keeps whole buckets in one chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"

namespace gradcomp::quantize {

// Header flag: some bucket held NaN/Inf under nonfinite=pass, so NaN scales are legitimate in this payload.
inline constexpr std::uint16_t kFlagNonFinite = 1;

// Per-chunk non-finite findings of a fused encode pass, combined in chunk order (so the totals do not depend on the
// thread count): the total count into stats.nonfinite and, when `first_nonfinite` is not null, the smallest index
// (or `numel` when none) into *first_nonfinite.
void report_nonfinite(std::span<const std::size_t> chunk_counts, std::span<const std::size_t> chunk_firsts,
                      std::size_t numel, CompressStats& stats, std::size_t* first_nonfinite);

// Number of buckets of `bucket` elements covering `numel` (the last one may be partial).
constexpr std::size_t bucket_count(std::size_t numel, std::size_t bucket) { return (numel + bucket - 1) / bucket; }

// Parallel chunk (elements) for `bucket`: a multiple of the bucket near kernels::kParallelChunk, independent of the
// thread count, so every bucket lies in one chunk.
std::size_t bucket_chunk(std::size_t bucket);

// Throws CorruptPayload unless the header's params, flags (subset of `allowed_flags`), dtype (f32/f16/bf16) and
// section count match what this codec instance writes.
void check_header(const payload::View& view, std::string_view codec, std::uint32_t param0, std::uint32_t param1,
                  std::uint16_t allowed_flags, std::size_t sections);

// Throws CorruptPayload unless section `index` has exactly `expected` bytes.
void check_section(const payload::View& view, std::string_view codec, std::size_t index, std::size_t expected,
                   std::string_view what);

// Copies `count` f32 scales from the (possibly unaligned) section into `out` and checks them: each must be >= 0 and
// finite, or NaN when the payload carries kFlagNonFinite. Throws CorruptPayload naming the first bad bucket.
void read_scales(const payload::View& view, std::string_view codec, std::size_t section, std::size_t count,
                 float* out);

// The payload of a bucketed quantizer (qsgd, terngrad, onebit) for one configuration: header params, section 0 = one
// f32 scale per bucket, section 1 = `bits`-bit codes. Each codec builds it from its parameters (<codec>_layout() in
// compressors/<codec>.h); its CPU skeleton (compressors/codecs/bucket_quantizer.h) and its CUDA backend
// (compressors/cuda/quantize_cuda_backend.cc) both take header and validation from it, so they write and accept the same bytes.
struct BucketLayout {
  payload::CodecId codec = payload::CodecId::kCustom;
  std::string_view name;          // the codec's registry name, for messages
  unsigned bits = 0;              // code width
  std::size_t bucket = 0;         // values per scale; 0 = one scale for the whole tensor
  std::uint32_t param0 = 0, param1 = 0;
  std::string_view code_section;  // what section 1 is called in messages ("packed-level", "sign-bit", ...)

  // The bucket covering `numel` values: `bucket`, or numel (at least 1) for one scale.
  std::size_t effective_bucket(std::size_t numel) const;
  // The CPU loops' parallel chunk: whole buckets (bucket_chunk), or kernels::kParallelChunk for one scale.
  std::size_t chunk() const;
  // The header of a payload of `numel` values whose original type is `dtype`.
  payload::Header header(std::size_t numel, DType dtype) const;
  // Throws CorruptPayload unless the header (check_header), the code section and the scale section's size match
  // what this layout writes for `numel`; returns the number of buckets (scale values are checked by read_scales or
  // the CUDA backend).
  std::size_t check(const payload::View& view, std::size_t numel) const;
};

// Parameter declarations shared by the bucketed codecs.
ParamSpec bucket_param(std::string default_value, double min, std::string help);
ParamSpec seed_param();

// Throws InvalidArgument unless `bucket` is a multiple of 8 (bucket starts must be byte-aligned in packed sections).
void check_bucket_multiple(std::string_view codec, long long bucket, bool zero_allowed);

}  // namespace gradcomp::quantize
