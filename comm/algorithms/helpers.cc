#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"

namespace gradcomp::algorithms {

Bytes compress_part(Call& call, const TensorView& part, std::string_view name, float prescale,
                    std::span<const TensorSegment> segments) {
  Stopwatch watch(call.stats.compress_s);
  CompressContext ctx;
  ctx.name = name;
  ctx.segments = segments;
  ctx.step = call.options.step;
  ctx.rank = call.comm.rank();
  ctx.world_size = call.comm.size();
  ctx.prescale = prescale;
  Bytes payload(call.compressor.max_payload_bytes(part.numel()));
  const std::size_t size = call.compressor.compress(part, payload, ctx);
  GRADCOMP_ASSERT(size <= payload.size(), "compressor '{}' wrote {} bytes for '{}', more than its bound {}",
                  call.compressor.name(), size, name, payload.size());
  payload.shrink(size);
  return payload;
}

std::vector<TensorSegment> segments_in(const Call& call, std::size_t begin, std::size_t count) {
  const std::size_t end = begin + count;
  if (call.options.segments.empty()) {
    return {TensorSegment{call.name, 0, count, begin, call.tensor.numel()}};
  }
  std::vector<TensorSegment> cut;
  for (const TensorSegment& segment : call.options.segments) {
    const std::size_t total = segment.total ? segment.total : segment.numel;
    const std::size_t lo = std::max(begin, segment.offset), hi = std::min(end, segment.offset + segment.numel);
    if (lo >= hi) continue;
    cut.push_back(TensorSegment{segment.name, lo - begin, hi - lo, segment.start + (lo - segment.offset), total});
  }
  return cut;
}

void load_f32(const TensorView& in, std::span<float> out) {
  GRADCOMP_ASSERT(out.size() == in.numel(), "load_f32: {} values for {}", out.size(), in.describe());
  if (in.numel() == 0) return;
  const auto* bits = static_cast<const std::uint16_t*>(in.data());
  switch (in.dtype()) {
    case DType::kF32: std::memcpy(out.data(), in.data(), out.size_bytes()); return;
    case DType::kF16:
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = kernels::half_bits_to_float(bits[i]);
      return;
    case DType::kBF16:
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = kernels::bf16_bits_to_float(bits[i]);
      return;
    default:
      throw InvalidArgument(fmt::format("compressed_allreduce: cannot read {}", in.describe()));
  }
}

void store_f32(std::span<const float> values, const TensorView& out) {
  GRADCOMP_ASSERT(values.size() == out.numel(), "store_f32: {} values for {}", values.size(), out.describe());
  if (out.numel() == 0) return;
  switch (out.dtype()) {
    case DType::kF32:
      if (out.data() != values.data()) std::memcpy(out.data(), values.data(), values.size_bytes());
      return;
    case DType::kF16: {
      auto* bits = static_cast<std::uint16_t*>(out.data());
      for (std::size_t i = 0; i < values.size(); ++i) bits[i] = kernels::float_to_half_bits(values[i]);
      return;
    }
    case DType::kBF16: {
      auto* bits = static_cast<std::uint16_t*>(out.data());
      for (std::size_t i = 0; i < values.size(); ++i) bits[i] = kernels::float_to_bf16_bits(values[i]);
      return;
    }
    default:
      throw InvalidArgument(fmt::format("compressed_allreduce: cannot store into {}", out.describe()));
  }
}

std::size_t ring_allreduce_bytes(std::size_t bytes, int n) {
  return n <= 1 ? 0 : 2 * bytes * static_cast<std::size_t>(n - 1) / static_cast<std::size_t>(n);
}

std::size_t ring_allgather_bytes(std::size_t total, int n) {
  return n <= 1 ? 0 : total * static_cast<std::size_t>(n - 1) / static_cast<std::size_t>(n);
}

std::vector<std::uint64_t> allgather_u64(Communicator& comm, std::uint64_t value) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(std::as_bytes(std::span(&value, 1)), std::as_writable_bytes(std::span(all)));
  return all;
}

}  // namespace gradcomp::algorithms
