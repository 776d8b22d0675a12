// Sparse allreduce with a dense switch (after SparCML, Renggli et al. 2019). The sparse representation is the codec's
// own self-describing payload (top-k, DGC, ... carry (index, value) pairs): the ranks first agree on the payload sizes
// (one allgather of a u64). While the payloads together are smaller than the break-even of a dense f32 ring allreduce
// — sum of payload bytes <= sparse_switch_density * 8 * numel, i.e. (n-1)/n * sum <= 2(n-1)/n * 4 * numel at 1.0 —
// they are allgathered and decoded-and-added in rank order; past it every rank decodes its own payload and the
// decoded tensors are summed in rank order too (ordered_sum_f32, stats.switched_to_dense). Either way all ranks end
// bit-identical, and a tensor's sum does not depend on which tensors shared its buffer (small tensors switch alone,
// their headers outweighing their values, and not when fused). (Decoding to a dense buffer and re-extracting the nonzeros as pairs was the first version: it cost
// two extra passes over the tensor for no bytes saved, see docs/comm.md.)
#include <cstdint>
#include <numeric>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

void run_sparse(Call& call) {
  const int n = call.comm.size();
  const std::size_t numel = call.tensor.numel();
  Bytes payload = compress_own(call);

  std::vector<std::uint64_t> sizes;
  {
    Stopwatch watch(call.stats.communicate_s);
    sizes = allgather_u64(call.comm, payload.size());
  }
  call.stats.wire_bytes += n > 1 ? 8 * (n - 1) : 0;
  const std::uint64_t total = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
  const bool go_dense =
      static_cast<double>(total) > call.options.sparse_switch_density * 8.0 * static_cast<double>(numel);
  call.stats.switched_to_dense = go_dense;

  // The sum goes straight into the tensor when it is f32 (its input was consumed by compress()).
  Bytes holder(0);
  float* sum = f32_sum_buffer(call, holder);
  const TensorView sum_view = call.space.view(sum, numel, DType::kF32);

  if (go_dense) {
    {
      Stopwatch watch(call.stats.decompress_s);
      call.compressor.decompress(PayloadBytes(payload, call.space.memory()), sum_view, DecodeMode::kOverwrite);
    }
    ordered_sum_f32(call, sum, numel);
  } else {
    std::vector<std::size_t> payload_sizes(sizes.begin(), sizes.end());
    Bytes gathered = allgatherv_payloads(call, payload, payload_sizes);
    Stopwatch watch(call.stats.decompress_s);
    decode_in_rank_order(call, gathered, payload_sizes, sum_view);
    if (call.keep_gathered != nullptr && call.options.op == ReduceOp::kSum) {
      *call.keep_gathered = GatheredPayloads{std::move(gathered), std::move(payload_sizes)};
    }
  }

  Stopwatch watch(call.stats.decompress_s);
  const float divisor = call.options.op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
  const std::size_t nonzero = call.space.divide(sum, numel, divisor, /*count_nonzero=*/!go_dense);
  if (!go_dense) call.stats.union_nnz = nonzero;
  call.space.store_f32(sum, call.tensor);
}

}  // namespace gradcomp::algorithms
