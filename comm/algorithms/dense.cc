// Dense allreduce of a summable payload: the body is one array of the codec's wire dtype, so summing bodies
// elementwise sums what the ranks transmitted. For kAverage each rank prescales by 1/n before encoding, so a
// half-precision sum cannot overflow where the average would not (PyTorch's fp16 hook does the same).
#include <array>

#include "comm/algorithms/algorithms.h"
#include "compressors/payload.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

void run_dense(Call& call) {
  const CompressorTraits traits = call.compressor.traits();
  require_codec(call, traits.summable, "dense", "a summable codec", "auto, allgather, sparse or sra");
  const int n = call.comm.size();
  const float prescale = call.options.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(n) : 1.0f;
  Bytes payload = compress_part(call, call.tensor, call.name, prescale, call.options.segments);
  call.stats.payload_bytes = payload.size();

  std::array<std::byte, payload::kHeaderBytes> prefix{};
  GRADCOMP_CHECK_AS(CommError, payload.size() >= prefix.size(),
                    "compressed_allreduce('{}'): codec '{}' wrote a {}-byte payload, shorter than a header", call.name,
                    call.compressor.name(), payload.size());
  call.space.read(prefix.data(), payload.data(), prefix.size());
  const payload::Header header = payload::decode_header(prefix, payload.size());
  GRADCOMP_CHECK_AS(CommError, header.section_count == 1,
                    "compressed_allreduce('{}'): codec '{}' is declared summable but its payload has {} sections "
                    "(a summable payload is one dense body)",
                    call.name, call.compressor.name(), header.section_count);
  const std::size_t body_bytes = header.section_bytes[0];
  const std::size_t element = dtype_size(traits.wire_dtype);
  GRADCOMP_CHECK_AS(CommError, body_bytes == call.tensor.numel() * element,
                    "compressed_allreduce('{}'): summable codec '{}' wrote a body of {} bytes for {} elements of {}",
                    call.name, call.compressor.name(), body_bytes, call.tensor.numel(), dtype_name(traits.wire_dtype));
  std::byte* body = payload.data() + payload::section_offset(header, 0);
  {
    Stopwatch watch(call.stats.communicate_s);
    call.comm.allreduce(call.space.view(body, call.tensor.numel(), traits.wire_dtype), ReduceOp::kSum);
  }
  call.stats.wire_bytes += ring_allreduce_bytes(body_bytes, n);
  Stopwatch watch(call.stats.decompress_s);
  call.compressor.decompress(payload, call.tensor, DecodeMode::kOverwrite);
}

}  // namespace gradcomp::algorithms
