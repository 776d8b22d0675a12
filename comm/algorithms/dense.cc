// Dense allreduce of a summable payload: the body is one array of the codec's wire dtype, so summing bodies
// elementwise sums what the ranks transmitted. For kAverage each rank prescales by 1/n before encoding, so a
// half-precision sum cannot overflow where the average would not (PyTorch's fp16 hook does the same).
// On a communicator that reduces only memory it owns (comm/owned_buffer_allreduce.h: MPI) the codec encodes straight
// into that memory and decodes from the result: two passes over the tensor instead of four. A tensor made of parts (a
// fusion buffer's members, dense_allreduce_parts) is encoded from the parts and decoded into them the same way.
#include <algorithm>
#include <array>
#include <functional>

#include "comm/algorithms/algorithms.h"
#include "comm/owned_buffer_allreduce.h"
#include "compressors/framework/gather_codec.h"
#include "compressors/framework/payload.h"
#include "gradcomp/error.h"
#include "kernels/usage_counters.h"

namespace gradcomp::algorithms {

namespace {

// What one dense allreduce encodes from and decodes into: the call's tensor, or the parts it is made of.
struct DenseIo {
  std::size_t numel = 0;
  std::function<std::size_t(std::span<std::byte> out, const CompressContext& ctx)> encode;  // the payload's size
  std::function<void(std::span<const std::byte> payload)> decode;                          // overwrites
};

// Where a summable payload's body lies, checked against what the codec declared (one section of numel elements of
// its wire dtype); `prefix` holds the payload's first bytes (its header), `size` its length.
std::size_t checked_body_bytes(const Call& call, const CompressorTraits& traits, std::size_t numel,
                               const std::array<std::byte, payload::kHeaderBytes>& prefix, std::size_t size,
                               std::size_t& body_offset) {
  GRADCOMP_CHECK_AS(CommError, size >= prefix.size(),
                    "compressed_allreduce('{}'): codec '{}' wrote a {}-byte payload, shorter than a header", call.name,
                    call.compressor.name(), size);
  const payload::Header header = payload::decode_header(prefix, size);
  GRADCOMP_CHECK_AS(CommError, header.section_count == 1,
                    "compressed_allreduce('{}'): codec '{}' is declared summable but its payload has {} sections "
                    "(a summable payload is one dense body)",
                    call.name, call.compressor.name(), header.section_count);
  const std::size_t body_bytes = header.section_bytes[0];
  GRADCOMP_CHECK_AS(CommError, body_bytes == numel * dtype_size(traits.wire_dtype),
                    "compressed_allreduce('{}'): summable codec '{}' wrote a body of {} bytes for {} elements of {}",
                    call.name, call.compressor.name(), body_bytes, numel, dtype_name(traits.wire_dtype));
  body_offset = payload::section_offset(header, 0);
  return body_bytes;
}

// The dense algorithm inside the communicator's own buffers: encode into its send buffer, decode from its result.
void run_dense_in_owned_buffer(Call& call, OwnedBufferAllreduce& staged, const CompressorTraits& traits,
                               float prescale, const DenseIo& io) {
  const std::size_t capacity = call.compressor.max_payload_bytes(io.numel);
  std::size_t body_bytes = 0;
  double compress_s = 0, decompress_s = 0, total_s = 0;
  Stopwatch total(total_s);
  staged.allreduce_in_owned_buffer(
      capacity,
      [&](std::span<std::byte> send) {
        Stopwatch watch(compress_s);
        const CompressContext ctx = compress_context(call, call.name, prescale, call.options.segments);
        const std::size_t size = io.encode(send, ctx);
        GRADCOMP_ASSERT(size <= send.size(), "compressor '{}' wrote {} bytes for '{}', more than its bound {}",
                        call.compressor.name(), size, call.name, send.size());
        std::array<std::byte, payload::kHeaderBytes> prefix{};
        if (size >= prefix.size()) std::copy_n(send.data(), prefix.size(), prefix.data());
        std::size_t offset = 0;
        body_bytes = checked_body_bytes(call, traits, io.numel, prefix, size, offset);
        call.stats.payload_bytes = size;
        return OwnedBufferAllreduce::Filled{size, offset, io.numel, traits.wire_dtype};
      },
      [&](std::span<const std::byte> result) {
        Stopwatch watch(decompress_s);
        io.decode(result);
      });
  total.stop();
  call.stats.compress_s += compress_s;
  call.stats.decompress_s += decompress_s;
  call.stats.communicate_s += total_s - compress_s - decompress_s;
  call.stats.wire_bytes += ring_allreduce_bytes(body_bytes, call.comm.size());
}

// Compresses through `io` into a payload of call.space.
Bytes encode_payload(Call& call, const DenseIo& io, float prescale) {
  Stopwatch watch(call.stats.compress_s);
  const CompressContext ctx = compress_context(call, call.name, prescale, call.options.segments);
  const std::size_t bound = call.compressor.payload_bound(io.numel, call.options.segments);
  Bytes payload = call.space.allocate(padded_bytes(bound));  // as compress_part: a slot a device codec may fill
  payload.shrink(bound);
  const std::size_t size = io.encode(payload, ctx);
  GRADCOMP_ASSERT(size <= bound, "compressor '{}' wrote {} bytes for '{}', more than its bound {}",
                  call.compressor.name(), size, call.name, bound);
  payload.shrink(size);
  return payload;
}

void run_dense_io(Call& call, const DenseIo& io) {
  const CompressorTraits traits = call.compressor.traits();
  require_codec(call, traits.summable, "dense", "a summable codec", "auto, allgather, sparse or sra");
  const int n = call.comm.size();
  const float prescale = call.options.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(n) : 1.0f;
  if (auto* staged = dynamic_cast<OwnedBufferAllreduce*>(&call.comm); staged != nullptr && !call.space.is_device()) {
    run_dense_in_owned_buffer(call, *staged, traits, prescale, io);
    return;
  }
  Bytes payload = encode_payload(call, io, prescale);
  call.stats.payload_bytes = payload.size();

  std::array<std::byte, payload::kHeaderBytes> prefix{};
  if (payload.size() >= prefix.size()) call.space.read(prefix.data(), payload.data(), prefix.size());
  std::size_t offset = 0;
  const std::size_t body_bytes = checked_body_bytes(call, traits, io.numel, prefix, payload.size(), offset);
  std::byte* body = payload.data() + offset;
  {
    Stopwatch watch(call.stats.communicate_s);
    call.comm.allreduce(call.space.view(body, io.numel, traits.wire_dtype), ReduceOp::kSum);
  }
  call.stats.wire_bytes += ring_allreduce_bytes(body_bytes, n);
  Stopwatch watch(call.stats.decompress_s);
  io.decode(payload);
}

}  // namespace

void run_dense(Call& call) {
  const DenseIo io{call.tensor.numel(),
                   [&](std::span<std::byte> out, const CompressContext& ctx) {
                     return call.compressor.compress(call.tensor, out, ctx);
                   },
                   [&](std::span<const std::byte> payload) {
                     call.compressor.decompress(PayloadBytes(payload, call.space.memory()), call.tensor,
                                                DecodeMode::kOverwrite);
                   }};
  run_dense_io(call, io);
}

AllreduceStats dense_allreduce_parts(Communicator& comm, Compressor& compressor, std::span<const TensorView> parts,
                                     std::string_view name, const AllreduceOptions& options) {
  auto* gather = dynamic_cast<GatherCodec*>(&compressor);
  GRADCOMP_CHECK(gather != nullptr && gather->gathers(),
                 "dense_allreduce_parts('{}'): codec '{}' cannot encode parts on rank {} (it needs a summable codec)",
                 name, compressor.spec(), comm.rank());
  GRADCOMP_CHECK(!options.verify && !options.hierarchical && !options.hierarchy_auto &&
                     resolve_algorithm(compressor.traits(), options.algorithm) == AllreduceAlgorithm::kDense,
                 "dense_allreduce_parts('{}'): only the flat dense algorithm of a negotiated call (verify off) "
                 "reduces parts (rank {})", name, comm.rank());
  const kernels::UsageCounts before = kernels::thread_usage();
  AllreduceStats stats;
  stats.algorithm = AllreduceAlgorithm::kDense;
  std::size_t numel = 0;
  for (const TensorView& part : parts) {
    numel += part.numel();
    stats.input_bytes += part.bytes();
  }
  Call call{comm, host_space(), compressor, TensorView(), name, options, stats};
  const DenseIo io{numel,
                   [&](std::span<std::byte> out, const CompressContext& ctx) {
                     return gather->compress_parts(parts, out, ctx);
                   },
                   [&](std::span<const std::byte> payload) {
                     gather->decompress_parts(payload, parts, DecodeMode::kOverwrite);
                   }};
  run_dense_io(call, io);
  const kernels::UsageCounts& after = kernels::thread_usage();
  stats.allocations = after.allocations - before.allocations;
  stats.synchronizations = after.synchronizations - before.synchronizations;
  return stats;
}

}  // namespace gradcomp::algorithms
