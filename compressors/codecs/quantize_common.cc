#include "compressors/codecs/quantize_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gradcomp/error.h"
#include "kernels/bitpack_ops.cuh"
#include "kernels/cpu_parallel.h"

namespace gradcomp::quantize {

void report_nonfinite(std::span<const std::size_t> chunk_counts, std::span<const std::size_t> chunk_firsts,
                      std::size_t numel, CompressStats& stats, std::size_t* first_nonfinite) {
  std::size_t count = 0;
  std::size_t first = numel;
  for (std::size_t k = 0; k < chunk_counts.size(); ++k) {
    count += chunk_counts[k];
    first = std::min(first, chunk_firsts[k]);
  }
  stats.nonfinite = count;
  if (first_nonfinite) *first_nonfinite = first;
}

std::size_t bucket_chunk(std::size_t bucket) {
  if (bucket >= kernels::kParallelChunk) return bucket;
  return kernels::kParallelChunk / bucket * bucket;
}

void check_header(const payload::View& view, std::string_view codec, std::uint32_t param0, std::uint32_t param1,
                  std::uint16_t allowed_flags, std::size_t sections) {
  const auto& header = view.header;
  GRADCOMP_CHECK_AS(CorruptPayload, header.param0 == param0 && header.param1 == param1,
                    "corrupt or mismatched '{}' payload: header params ({:#x}, {:#x}) but this compressor expects "
                    "({:#x}, {:#x}) (was it encoded with other parameters?)",
                    codec, header.param0, header.param1, param0, param1);
  GRADCOMP_CHECK_AS(CorruptPayload, (header.flags & ~allowed_flags) == 0, "corrupt '{}' payload: unknown flags {:#x}",
                    codec, header.flags);
  GRADCOMP_CHECK_AS(CorruptPayload,
                    header.dtype == DType::kF32 || header.dtype == DType::kF16 || header.dtype == DType::kBF16,
                    "corrupt '{}' payload: original dtype {} is not a float type", codec, dtype_name(header.dtype));
  GRADCOMP_CHECK_AS(CorruptPayload, header.section_count == sections, "corrupt '{}' payload: {} sections, expected {}",
                    codec, header.section_count, sections);
}

void check_section(const payload::View& view, std::string_view codec, std::size_t index, std::size_t expected,
                   std::string_view what) {
  GRADCOMP_CHECK_AS(CorruptPayload, view.sections[index].size() == expected,
                    "corrupt '{}' payload: {} section has {} bytes, expected {} for {} elements", codec, what,
                    view.sections[index].size(), expected, view.header.numel);
}

void read_scales(const payload::View& view, std::string_view codec, std::size_t section, std::size_t count,
                 float* out) {
  check_section(view, codec, section, count * sizeof(float), "scale");
  if (count) std::memcpy(out, view.sections[section].data(), count * sizeof(float));
  const bool nan_ok = (view.header.flags & kFlagNonFinite) != 0;
  for (std::size_t b = 0; b < count; ++b) {
    const float scale = out[b];
    const bool ok = (scale >= 0.0f && std::isfinite(scale)) || (nan_ok && std::isnan(scale));
    GRADCOMP_CHECK_AS(CorruptPayload, ok, "corrupt '{}' payload: bucket {} has scale {} (must be finite and >= 0{})",
                      codec, b, scale, nan_ok ? ", or NaN" : "");
  }
}

std::size_t BucketLayout::effective_bucket(std::size_t numel) const {
  return bucket ? bucket : std::max<std::size_t>(numel, 1);
}

std::size_t BucketLayout::chunk() const { return bucket ? bucket_chunk(bucket) : kernels::kParallelChunk; }

payload::Header BucketLayout::header(std::size_t numel, DType dtype) const {
  payload::Header header;
  header.codec = codec;
  header.numel = numel;
  header.dtype = dtype;
  header.section_count = 2;
  header.section_bytes[0] = bucket_count(numel, effective_bucket(numel)) * sizeof(float);
  header.section_bytes[1] = kernels::packed_bytes(numel, bits);
  header.param0 = param0;
  header.param1 = param1;
  return header;
}

std::size_t BucketLayout::check(const payload::View& view, std::size_t numel) const {
  check_header(view, name, param0, param1, kFlagNonFinite, 2);
  check_section(view, name, 1, kernels::packed_bytes(numel, bits), code_section);
  const std::size_t buckets = bucket_count(numel, effective_bucket(numel));
  check_section(view, name, 0, buckets * sizeof(float), "scale");
  return buckets;
}

ParamSpec bucket_param(std::string default_value, double min, std::string help) {
  return ParamSpec{"bucket", ParamSpec::Kind::kInt, std::move(default_value), min, double(1 << 24), false, {},
                   std::move(help)};
}

ParamSpec seed_param() {
  return ParamSpec{"seed", ParamSpec::Kind::kInt, "0", 0, 4294967295.0, false, {},
                   "Philox seed of the stochastic rounding (with step, tensor name and element index)"};
}

void check_bucket_multiple(std::string_view codec, long long bucket, bool zero_allowed) {
  GRADCOMP_CHECK((bucket == 0 && zero_allowed) || (bucket > 0 && bucket % 8 == 0),
                 "compressor '{}': bucket={} must be a positive multiple of 8{} (bucket starts are byte-aligned in the "
                 "packed payload)",
                 codec, bucket, zero_allowed ? " or 0 (one scale for the whole tensor)" : "");
}

}  // namespace gradcomp::quantize
