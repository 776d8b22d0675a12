// Scatter-reduce-allgather for requantizable codecs (CGX; DeepSpeed's compressed allreduce). The tensor is cut into
// `size` chunks; every rank compresses each chunk (error feedback keyed by the tensor names of the call's segments, a
// chunk holding a part of each; random streams by "<name>#chunk<i>") and sends chunk i to rank i (alltoallv); rank i
// decodes and sums the chunks it received in rank order, recompresses the result with its own error feedback (state
// "<name>#sra<i>": the residual of the owner's re-quantization, not of any rank's gradient), and an allgatherv gives
// everyone every recompressed chunk to decode. Per rank that is
// about 2(n-1)/n of one compressed tensor on the wire, instead of (n-1) payloads for an allgather.
#include <numeric>

#include <fmt/format.h>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {
namespace {

// Chunk i of n over numel elements: [i*numel/n, (i+1)*numel/n).
std::size_t chunk_begin(std::size_t numel, int i, int n) {
  return static_cast<std::size_t>((static_cast<unsigned __int128>(numel) * static_cast<unsigned>(i)) /
                                  static_cast<unsigned>(n));
}

}  // namespace

void run_scatter_reduce_allgather(Call& call) {
  const int n = call.comm.size();
  const int me = call.comm.rank();
  const std::size_t numel = call.tensor.numel();
  MemorySpace& space = call.space;

  // 1. compress every chunk, then pack the payloads back to back.
  std::vector<Bytes> payloads;
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(n));
  std::size_t send_total = 0;
  for (int i = 0; i < n; ++i) {
    const std::size_t begin = chunk_begin(numel, i, n), end = chunk_begin(numel, i + 1, n);
    const std::vector<TensorSegment> segments = segments_in(call, begin, end - begin);
    payloads.push_back(compress_part(call, call.tensor.slice(begin, end - begin),
                                     fmt::format("{}#chunk{}", call.name, i), 1.0f, segments));
    send_counts[i] = payloads.back().size();
    send_total += send_counts[i];
  }
  Bytes send = space.allocate(send_total);
  send.shrink(send_total);
  for (std::size_t i = 0, offset = 0; i < payloads.size(); offset += send_counts[i], ++i) {
    space.copy(send.data() + offset, payloads[i].data(), send_counts[i]);
  }
  payloads.clear();
  call.stats.payload_bytes = send_total;

  // 2. sizes matrix (every rank learns every chunk size), alltoallv.
  std::vector<std::uint64_t> matrix(static_cast<std::size_t>(n) * n);
  std::vector<std::size_t> recv_counts(static_cast<std::size_t>(n));
  Bytes received(0);
  {
    Stopwatch watch(call.stats.communicate_s);
    std::vector<std::uint64_t> mine(send_counts.begin(), send_counts.end());
    call.comm.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(matrix)));
    for (int s = 0; s < n; ++s) recv_counts[s] = static_cast<std::size_t>(matrix[s * n + me]);
    const std::size_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
    received = space.allocate(recv_total);
    received.shrink(recv_total);
    space.synchronize();
    call.comm.alltoallv(send, send_counts, received, recv_counts);
  }
  for (int d = 0; d < n; ++d) {
    if (d != me) call.stats.wire_bytes += send_counts[d];
  }
  call.stats.wire_bytes += n > 1 ? 8 * n * (n - 1) : 0;

  // 3. reduce my chunk, recompress it.
  const std::size_t my_begin = chunk_begin(numel, me, n), my_len = chunk_begin(numel, me + 1, n) - my_begin;
  Bytes sum_bytes = space.allocate(my_len * sizeof(float));
  auto* sum = reinterpret_cast<float*>(sum_bytes.data());
  const TensorView sum_view = space.view(sum, my_len, DType::kF32);
  {
    Stopwatch watch(call.stats.decompress_s);
    decode_in_rank_order(call, received, recv_counts, sum_view);
    if (call.options.op == ReduceOp::kAverage && n > 1) space.divide(sum, my_len, static_cast<float>(n), false);
  }
  const auto reduced = compress_part(call, sum_view, fmt::format("{}#sra{}", call.name, me), 1.0f);
  call.stats.payload_bytes += reduced.size();

  // 4. allgatherv of the reduced chunks, decode each into its slice.
  std::vector<std::size_t> counts;
  const Bytes gathered = allgather_payloads(call, reduced, counts);
  Stopwatch watch(call.stats.decompress_s);
  const std::span<const std::byte> all = gathered;
  std::size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    const std::size_t begin = chunk_begin(numel, r, n), end = chunk_begin(numel, r + 1, n);
    call.compressor.decompress(all.subspan(offset, counts[r]), call.tensor.slice(begin, end - begin),
                               DecodeMode::kOverwrite);
    offset += counts[r];
  }
}

}  // namespace gradcomp::algorithms
