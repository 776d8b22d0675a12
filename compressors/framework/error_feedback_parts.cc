// GatherCodec for the built-in codecs: a summable codec encodes a tensor made of parts from the parts themselves
// (the flow of compress() with each segment's values read where its part lives) and decodes into them (each part
// from its range of the one dense body), so a fusion buffer's members need no buffer that holds them laid out.
#include <cstdint>

#include <fmt/format.h>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/float_views.h"
#include "compressors/framework/segmented_payload.h"
#include "compressors/framework/segments.h"
#include "gradcomp/error.h"

namespace gradcomp {
namespace {

// Throws InvalidArgument unless `parts` are host views of one float dtype; returns their elements in all.
std::size_t checked_parts(std::span<const TensorView> parts, std::string_view codec, std::string_view what) {
  GRADCOMP_CHECK(!parts.empty(), "compressor '{}': {} of no parts", codec, what);
  std::size_t numel = 0;
  for (const TensorView& part : parts) {
    check_float_dtype(part, codec, fmt::format("a part of {}", what));
    GRADCOMP_CHECK(part.device().is_cpu() && part.dtype() == parts[0].dtype(),
                   "compressor '{}': {} needs host parts of one dtype, got {} beside {}", codec, what,
                   part.describe(), parts[0].describe());
    numel += part.numel();
  }
  return numel;
}

}  // namespace

std::size_t ErrorFeedbackCompressor::compress_parts(std::span<const TensorView> parts, std::span<std::byte> out,
                                                    const CompressContext& ctx) {
  GRADCOMP_CHECK(gathers(), "compressor '{}' cannot encode parts (its payload is not one summable body)", name_);
  GRADCOMP_CHECK(!ctx.name.empty(), "compressor '{}': CompressContext.name must name the tensor", name_);
  const std::size_t n = checked_parts(parts, name_, fmt::format("the compress of '{}'", ctx.name));
  const std::vector<TensorSegment> segments = resolve_segments(ctx, n, name_);
  GRADCOMP_CHECK(segments.size() == parts.size(), "compressor '{}': '{}' on rank {} has {} parts but {} segments",
                 name_, ctx.name, ctx.rank, parts.size(), segments.size());
  for (std::size_t s = 0; s < parts.size(); ++s) {
    GRADCOMP_CHECK(segments[s].numel == parts[s].numel(),
                   "compressor '{}': part {} of '{}' on rank {} has {} elements, its segment '{}' {}", name_, s,
                   ctx.name, ctx.rank, parts[s].numel(), segments[s].name, segments[s].numel);
  }
  const std::size_t needed = payload_bound(n, segments);
  GRADCOMP_CHECK(out.size() >= needed, "compressor '{}': output buffer for '{}' has {} bytes, {} needed", name_,
                 ctx.name, out.size(), needed);
  for (const TensorSegment& segment : segments) check_state_size(segment.name, segment.total, ctx.rank);
  for (const TensorSegment& segment : segments) sync_to_host(segment.name, /*drop_device=*/true);
  const DType dtype = parts[0].dtype();
  if (dtype != DType::kF32) scratch_in_.resize(n);  // f16/bf16 parts are encoded from their f32 values
  std::vector<const float*> values;
  values.reserve(parts.size());
  for (std::size_t s = 0; s < parts.size(); ++s) {
    if (dtype == DType::kF32) {
      values.push_back(static_cast<const float*>(parts[s].data()));
    } else {
      to_float(parts[s], scratch_in_.data() + segments[s].offset);
      values.push_back(scratch_in_.data() + segments[s].offset);
    }
  }
  return compress_host(values, segments, n, dtype, out, ctx);
}

void ErrorFeedbackCompressor::decompress_parts(std::span<const std::byte> bytes, std::span<const TensorView> parts,
                                               DecodeMode mode) {
  GRADCOMP_CHECK(gathers(), "compressor '{}' cannot decode into parts (its payload is not one summable body)", name_);
  const std::size_t n = checked_parts(parts, name_, "a decompress");
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % 16 != 0) {  // as decompress_plain: decoders load aligned
    scratch_payload_.assign(bytes.begin(), bytes.end());
    bytes = std::span<const std::byte>(scratch_payload_);
  }
  const payload::View view = payload::parse(bytes, codec_, static_cast<long long>(n));
  const std::size_t wire = dtype_size(traits_.wire_dtype);
  GRADCOMP_CHECK_AS(CorruptPayload,
                    !payload::is_segmented(view.header) && view.header.section_count == 1 &&
                        view.sections[0].size() == n * wire,
                    "corrupt '{}' payload: {} sections, the first of {} bytes, where one body of {} elements of {} "
                    "was expected",
                    name_, view.header.section_count, view.sections[0].size(), n, dtype_name(traits_.wire_dtype));
  // Each part decodes its range of the body as the payload of those elements alone (same header, that range).
  std::size_t offset = 0;
  for (const TensorView& part : parts) {
    payload::View piece = view;
    piece.header.numel = part.numel();
    piece.header.section_bytes[0] = part.numel() * wire;
    piece.sections[0] = view.sections[0].subspan(offset * wire, part.numel() * wire);
    decode_view(piece, part, mode);
    offset += part.numel();
  }
}

}  // namespace gradcomp
