#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

CompressContext compress_context(const Call& call, std::string_view name, float prescale,
                                 std::span<const TensorSegment> segments) {
  CompressContext ctx;
  ctx.name = name;
  ctx.segments = segments;
  ctx.step = call.options.step;
  ctx.rank = call.comm.rank();
  ctx.world_size = call.comm.size();
  ctx.prescale = prescale;
  return ctx;
}

Bytes compress_part(Call& call, const TensorView& part, std::string_view name, float prescale,
                    std::span<const TensorSegment> segments) {
  Stopwatch watch(call.stats.compress_s);
  const CompressContext ctx = compress_context(call, name, prescale, segments);
  const std::size_t bound = call.compressor.payload_bound(part.numel(), segments);
  Bytes payload = call.space.allocate(padded_bytes(bound));
  payload.shrink(bound);
  const std::size_t size = call.compressor.compress(part, payload, ctx);
  GRADCOMP_ASSERT(size <= bound, "compressor '{}' wrote {} bytes for '{}', more than its bound {}",
                  call.compressor.name(), size, name, bound);
  call.space.fill_zero(payload.data() + size, padded_bytes(size) - size);
  payload.shrink(size);
  return payload;
}

std::vector<std::size_t> padded_counts(std::span<const std::size_t> sizes) {
  std::vector<std::size_t> counts(sizes.size());
  for (std::size_t r = 0; r < sizes.size(); ++r) counts[r] = padded_bytes(sizes[r]);
  return counts;
}

void require_codec(const Call& call, bool ok, std::string_view algorithm, std::string_view kind,
                   std::string_view instead) {
  GRADCOMP_CHECK(ok, "compressed_allreduce('{}'): the {} algorithm needs {}, '{}' is {} (use {})", call.name,
                 algorithm, kind, call.compressor.spec(), describe_traits(call.compressor.traits()), instead);
}

Bytes allgather_payloads(Call& call, const Bytes& payload, std::vector<std::size_t>& sizes) {
  const int n = call.comm.size();
  {
    Stopwatch watch(call.stats.communicate_s);
    const auto all = allgather_u64(call.comm, payload.size());
    sizes.assign(all.begin(), all.end());
  }
  call.stats.wire_bytes += n > 1 ? 8 * (n - 1) : 0;
  return allgatherv_payloads(call, payload, sizes);
}

Bytes allgatherv_payloads(Call& call, const Bytes& payload, const std::vector<std::size_t>& sizes) {
  Stopwatch watch(call.stats.communicate_s);
  const std::vector<std::size_t> counts = padded_counts(sizes);
  std::size_t total = 0;
  for (const std::size_t count : counts) total += count;
  // Pooled and not zero-filled: a fresh multi-megabyte buffer costs a page fault per 4 KiB on every call.
  Bytes gathered = call.space.allocate(total);
  gathered.shrink(total);
  call.space.synchronize();
  call.comm.allgatherv(std::span<const std::byte>(payload.data(), padded_bytes(payload.size())), counts, gathered,
                           call.space.memory());
  call.stats.wire_bytes += ring_allgather_bytes(total, call.comm.size());
  return gathered;
}

void decode_in_rank_order(Call& call, std::span<const std::byte> all, std::span<const std::size_t> sizes,
                          const TensorView& sum) {
  std::vector<PayloadBytes> payloads;
  std::size_t offset = 0;
  for (const std::size_t size : sizes) {
    payloads.emplace_back(all.subspan(offset, size), call.space.memory());
    offset += padded_bytes(size);
  }
  call.compressor.decompress_sum(payloads, sum, DecodeMode::kOverwrite);
}

Bytes compress_own(Call& call) {
  Bytes payload = compress_part(call, call.tensor, call.name, 1.0f, call.options.segments);
  call.stats.payload_bytes = payload.size();
  return payload;
}

float* f32_sum_buffer(Call& call, Bytes& holder) {
  if (call.tensor.dtype() == DType::kF32) return static_cast<float*>(call.tensor.data());
  holder = call.space.allocate(call.tensor.numel() * sizeof(float));
  return reinterpret_cast<float*>(holder.data());
}

std::size_t piece_begin(std::size_t numel, int i, int n) {
  return static_cast<std::size_t>((static_cast<unsigned __int128>(numel) * static_cast<unsigned>(i)) /
                                  static_cast<unsigned>(n));
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
