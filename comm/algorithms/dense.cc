// Dense allreduce of a summable payload: the body is one array of the codec's wire dtype, so summing bodies
// elementwise sums what the ranks transmitted. For kAverage each rank prescales by 1/n before encoding, so a
// half-precision sum cannot overflow where the average would not (PyTorch's fp16 hook does the same).
// On a communicator that reduces only memory it owns (comm/owned_buffer_allreduce.h: MPI) the codec encodes straight
// into that memory and decodes from the result: two passes over the tensor instead of four.
#include <algorithm>
#include <array>

#include "comm/algorithms/algorithms.h"
#include "comm/owned_buffer_allreduce.h"
#include "compressors/framework/payload.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

namespace {

// Where a summable payload's body lies, checked against what the codec declared (one section of numel elements of
// its wire dtype); `prefix` holds the payload's first bytes (its header), `size` its length.
std::size_t checked_body_bytes(const Call& call, const CompressorTraits& traits,
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
  GRADCOMP_CHECK_AS(CommError, body_bytes == call.tensor.numel() * dtype_size(traits.wire_dtype),
                    "compressed_allreduce('{}'): summable codec '{}' wrote a body of {} bytes for {} elements of {}",
                    call.name, call.compressor.name(), body_bytes, call.tensor.numel(), dtype_name(traits.wire_dtype));
  body_offset = payload::section_offset(header, 0);
  return body_bytes;
}

// The dense algorithm inside the communicator's own buffers: encode into its send buffer, decode from its result.
void run_dense_in_owned_buffer(Call& call, OwnedBufferAllreduce& staged, const CompressorTraits& traits,
                               float prescale) {
  const std::size_t capacity = call.compressor.max_payload_bytes(call.tensor.numel());
  std::size_t body_bytes = 0;
  double compress_s = 0, decompress_s = 0, total_s = 0;
  Stopwatch total(total_s);
  staged.allreduce_in_owned_buffer(
      capacity,
      [&](std::span<std::byte> send) {
        Stopwatch watch(compress_s);
        const CompressContext ctx = compress_context(call, call.name, prescale, call.options.segments);
        const std::size_t size = call.compressor.compress(call.tensor, send, ctx);
        GRADCOMP_ASSERT(size <= send.size(), "compressor '{}' wrote {} bytes for '{}', more than its bound {}",
                        call.compressor.name(), size, call.name, send.size());
        std::array<std::byte, payload::kHeaderBytes> prefix{};
        if (size >= prefix.size()) std::copy_n(send.data(), prefix.size(), prefix.data());
        std::size_t offset = 0;
        body_bytes = checked_body_bytes(call, traits, prefix, size, offset);
        call.stats.payload_bytes = size;
        return OwnedBufferAllreduce::Filled{size, offset, call.tensor.numel(), traits.wire_dtype};
      },
      [&](std::span<const std::byte> result) {
        Stopwatch watch(decompress_s);
        call.compressor.decompress(result, call.tensor, DecodeMode::kOverwrite);
      });
  total.stop();
  call.stats.compress_s += compress_s;
  call.stats.decompress_s += decompress_s;
  call.stats.communicate_s += total_s - compress_s - decompress_s;
  call.stats.wire_bytes += ring_allreduce_bytes(body_bytes, call.comm.size());
}

}  // namespace

void run_dense(Call& call) {
  const CompressorTraits traits = call.compressor.traits();
  require_codec(call, traits.summable, "dense", "a summable codec", "auto, allgather, sparse or sra");
  const int n = call.comm.size();
  const float prescale = call.options.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(n) : 1.0f;
  if (auto* staged = dynamic_cast<OwnedBufferAllreduce*>(&call.comm); staged != nullptr && !call.space.is_device()) {
    run_dense_in_owned_buffer(call, *staged, traits, prescale);
    return;
  }
  Bytes payload = compress_part(call, call.tensor, call.name, prescale, call.options.segments);
  call.stats.payload_bytes = payload.size();

  std::array<std::byte, payload::kHeaderBytes> prefix{};
  if (payload.size() >= prefix.size()) call.space.read(prefix.data(), payload.data(), prefix.size());
  std::size_t offset = 0;
  const std::size_t body_bytes = checked_body_bytes(call, traits, prefix, payload.size(), offset);
  std::byte* body = payload.data() + offset;
  {
    Stopwatch watch(call.stats.communicate_s);
    call.comm.allreduce(call.space.view(body, call.tensor.numel(), traits.wire_dtype), ReduceOp::kSum);
  }
  call.stats.wire_bytes += ring_allreduce_bytes(body_bytes, n);
  Stopwatch watch(call.stats.decompress_s);
  call.compressor.decompress(payload, call.tensor, DecodeMode::kOverwrite);
}

}  // namespace gradcomp::algorithms
