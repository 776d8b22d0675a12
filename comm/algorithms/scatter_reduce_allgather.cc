// Scatter-reduce-allgather for requantizable codecs (CGX; DeepSpeed's compressed allreduce). Every tensor of the call
// (each segment, or the whole tensor) is cut into `size` pieces; chunk i is piece i of every tensor, owned by rank i.
// Every rank compresses each chunk (error feedback keyed by the tensor names, a piece being a segment that carries a
// part of its tensor, random streams keyed by the tensor and the piece's start) and sends chunk i to rank i
// (alltoallv); rank i decodes and sums the chunks it received in rank order, recompresses the result with its own
// error feedback (state "<tensor>#sra<i>": the residual of the owner's re-quantization, not of any rank's gradient),
// and an allgatherv gives everyone every recompressed chunk to decode. Because pieces are cut per tensor, a tensor's
// pieces, their owners and every value computed from them are the same whether it travels alone or fused. Per rank
// that is about 2(n-1)/n of one compressed tensor on the wire, instead of (n-1) payloads for an allgather.
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {
namespace {

// Chunk i of the call: piece i of every tensor, as segments over a contiguous buffer of the chunk's elements, and
// where each piece lies in the call's tensor.
struct Chunk {
  std::vector<TensorSegment> segments;  // offsets inside the chunk's buffer
  std::vector<std::size_t> at;          // element offset of each piece in the call's tensor
  std::size_t numel = 0;
  bool contiguous = true;  // the pieces are adjacent in the tensor: the chunk is a slice of it
};

Chunk chunk_of(const std::vector<TensorSegment>& tensors, int i, int n) {
  Chunk chunk;
  for (const TensorSegment& tensor : tensors) {
    const std::size_t begin = piece_begin(tensor.numel, i, n), end = piece_begin(tensor.numel, i + 1, n);
    TensorSegment piece = tensor;
    piece.offset = chunk.numel;
    piece.numel = end - begin;
    piece.start = tensor.start + begin;
    if (!chunk.at.empty() && chunk.at.back() + chunk.segments.back().numel != tensor.offset + begin) {
      chunk.contiguous = false;
    }
    chunk.at.push_back(tensor.offset + begin);
    chunk.segments.push_back(piece);
    chunk.numel += piece.numel;
  }
  return chunk;
}

// The call's tensors: its segments, or the whole tensor under the call's name.
std::vector<TensorSegment> tensors_of(const Call& call) {
  if (!call.options.segments.empty()) {
    std::vector<TensorSegment> tensors(call.options.segments.begin(), call.options.segments.end());
    for (TensorSegment& tensor : tensors) {
      if (tensor.total == 0) tensor.total = tensor.numel;
    }
    return tensors;
  }
  return {TensorSegment{call.name, 0, call.tensor.numel(), 0, call.tensor.numel(), call.tensor.rows()}};
}

// A chunk's elements as one contiguous view: a slice of the tensor, or the pieces gathered into `holder`.
TensorView chunk_view(Call& call, const Chunk& chunk, Bytes& holder) {
  if (chunk.contiguous) return call.tensor.slice(chunk.at.empty() ? 0 : chunk.at.front(), chunk.numel);
  const std::size_t elem = dtype_size(call.tensor.dtype());
  holder = call.space.allocate(std::max<std::size_t>(chunk.numel, 1) * elem);
  const auto* from = static_cast<const std::byte*>(call.tensor.data());
  for (std::size_t p = 0; p < chunk.segments.size(); ++p) {
    call.space.copy(holder.data() + chunk.segments[p].offset * elem, from + chunk.at[p] * elem,
                    chunk.segments[p].numel * elem);
  }
  return call.space.view(holder.data(), chunk.numel, call.tensor.dtype());
}

// Decodes `payload` (a recompressed chunk) into the chunk's places in the tensor.
void decode_chunk(Call& call, const Chunk& chunk, std::span<const std::byte> payload) {
  if (chunk.contiguous) {
    call.compressor.decompress(PayloadBytes(payload, call.space.memory()),
                               call.tensor.slice(chunk.at.empty() ? 0 : chunk.at.front(), chunk.numel),
                               DecodeMode::kOverwrite);
    return;
  }
  const std::size_t elem = dtype_size(call.tensor.dtype());
  Bytes decoded = call.space.allocate(std::max<std::size_t>(chunk.numel, 1) * elem);
  call.compressor.decompress(PayloadBytes(payload, call.space.memory()),
                             call.space.view(decoded.data(), chunk.numel, call.tensor.dtype()), DecodeMode::kOverwrite);
  auto* to = static_cast<std::byte*>(call.tensor.data());
  for (std::size_t p = 0; p < chunk.segments.size(); ++p) {
    call.space.copy(to + chunk.at[p] * elem, decoded.data() + chunk.segments[p].offset * elem,
                    chunk.segments[p].numel * elem);
  }
}

// Step 1: compresses every chunk (error feedback under "<call>#chunk<i>") and packs the payloads back to back, each in
// its padded slot (kPayloadAlign). `send_sizes` receives each payload's size, `send_counts` its padded slot.
Bytes pack_compressed_chunks(Call& call, const std::vector<Chunk>& chunks, std::vector<std::size_t>& send_sizes,
                             std::vector<std::size_t>& send_counts) {
  std::vector<Bytes> payloads;
  send_sizes.assign(chunks.size(), 0);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    Bytes gathered(0);
    const TensorView view = chunk_view(call, chunks[i], gathered);
    payloads.push_back(compress_part(call, view, fmt::format("{}#chunk{}", call.name, i), 1.0f, chunks[i].segments));
    send_sizes[i] = payloads.back().size();
  }
  send_counts = padded_counts(send_sizes);
  const std::size_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  Bytes send = call.space.allocate(send_total);
  send.shrink(send_total);
  for (std::size_t i = 0, offset = 0; i < payloads.size(); offset += send_counts[i], ++i) {
    call.space.copy(send.data() + offset, payloads[i].data(), send_counts[i]);  // the payload and its zeroed padding
  }
  payloads.clear();
  call.stats.payload_bytes = std::accumulate(send_sizes.begin(), send_sizes.end(), std::size_t{0});
  return send;
}

// Step 2: every rank learns the sizes of the chunks it owns (an alltoall of one u64 per pair: n values per rank, where
// the allgather of the whole sizes matrix held n^2, 8 MiB a rank at 1,024 ranks), then the alltoallv. Returns the
// chunks this rank owns, one per sender in rank order; `recv_sizes` receives their payload sizes.
Bytes exchange_chunks(Call& call, const Bytes& send, const std::vector<std::size_t>& send_sizes,
                      const std::vector<std::size_t>& send_counts, std::vector<std::size_t>& recv_sizes) {
  const int n = call.comm.size();
  const int me = call.comm.rank();
  recv_sizes.assign(static_cast<std::size_t>(n), 0);
  Bytes received(0);
  {
    Stopwatch watch(call.stats.communicate_s);
    const std::vector<std::uint64_t> mine(send_sizes.begin(), send_sizes.end());
    std::vector<std::uint64_t> theirs(static_cast<std::size_t>(n), 0);
    call.comm.alltoall(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(theirs)));
    for (int s = 0; s < n; ++s) recv_sizes[s] = static_cast<std::size_t>(theirs[s]);
    const std::vector<std::size_t> recv_counts = padded_counts(recv_sizes);
    const std::size_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
    received = call.space.allocate(recv_total);
    received.shrink(recv_total);
    call.space.synchronize();
    call.comm.alltoallv(send, send_counts, received, recv_counts, call.space.memory());
  }
  for (int d = 0; d < n; ++d) {
    if (d != me) call.stats.wire_bytes += send_counts[d];
  }
  call.stats.wire_bytes += n > 1 ? 8 * (n - 1) : 0;
  return received;
}

// Step 3: sums this rank's chunk from everyone's payloads in rank order (divided by the world size for kAverage) and
// recompresses the sum, each piece under its tensor's owner state "<tensor>#sra<me>".
Bytes reduce_own_chunk(Call& call, const Chunk& mine, const Bytes& received,
                       const std::vector<std::size_t>& recv_sizes) {
  const int n = call.comm.size();
  const int me = call.comm.rank();
  MemorySpace& space = call.space;
  Bytes sum_bytes = space.allocate(std::max<std::size_t>(mine.numel, 1) * sizeof(float));
  auto* sum = reinterpret_cast<float*>(sum_bytes.data());
  const TensorView sum_view = space.view(sum, mine.numel, DType::kF32);
  {
    Stopwatch watch(call.stats.decompress_s);
    decode_in_rank_order(call, received, recv_sizes, sum_view);
    if (call.options.op == ReduceOp::kAverage && n > 1) space.divide(sum, mine.numel, static_cast<float>(n), false);
  }
  std::vector<std::string> owner_names;  // outlives compress_part: the segments name their states by view
  for (const TensorSegment& piece : mine.segments) owner_names.push_back(fmt::format("{}#sra{}", piece.name, me));
  std::vector<TensorSegment> owned = mine.segments;
  for (std::size_t p = 0; p < owned.size(); ++p) {
    owned[p].name = owner_names[p];
    owned[p].start = 0;
    owned[p].total = owned[p].numel;
    owned[p].rows = 0;
  }
  Bytes reduced = compress_part(call, sum_view, fmt::format("{}#sra{}", call.name, me), 1.0f, owned);
  call.stats.payload_bytes += reduced.size();
  return reduced;
}

}  // namespace

void run_scatter_reduce_allgather(Call& call) {
  const int n = call.comm.size();
  const int me = call.comm.rank();
  const std::vector<TensorSegment> tensors = tensors_of(call);
  std::vector<Chunk> chunks;
  for (int i = 0; i < n; ++i) chunks.push_back(chunk_of(tensors, i, n));

  std::vector<std::size_t> send_sizes, send_counts, recv_sizes;
  const Bytes send = pack_compressed_chunks(call, chunks, send_sizes, send_counts);
  const Bytes received = exchange_chunks(call, send, send_sizes, send_counts, recv_sizes);
  const Bytes reduced = reduce_own_chunk(call, chunks[static_cast<std::size_t>(me)], received, recv_sizes);

  // Step 4: allgatherv of the reduced chunks, decode each into its pieces' places.
  std::vector<std::size_t> sizes;
  const Bytes gathered = allgather_payloads(call, reduced, sizes);
  Stopwatch watch(call.stats.decompress_s);
  const std::span<const std::byte> all = gathered;
  std::size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    decode_chunk(call, chunks[static_cast<std::size_t>(r)], all.subspan(offset, sizes[r]));
    offset += padded_bytes(sizes[r]);
  }
}

}  // namespace gradcomp::algorithms
