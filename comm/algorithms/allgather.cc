// Allgather of self-describing payloads: every rank receives every payload and decodes them in rank order, so the
// sum (and the result) is bit-identical on every rank. Costs (n-1)/n of the summed payloads per rank: good for
// sparse payloads far below 1/n density.
#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

void run_allgather(Call& call) {
  Bytes payload = compress_own(call);
  std::vector<std::size_t> sizes;
  Bytes gathered = allgather_payloads(call, payload, sizes);

  Stopwatch watch(call.stats.decompress_s);
  const int n = call.comm.size();
  const std::size_t numel = call.tensor.numel();
  Bytes holder(0);
  float* sum = f32_sum_buffer(call, holder);
  const TensorView sum_view = call.space.view(sum, numel, DType::kF32);
  decode_in_rank_order(call, gathered, sizes, sum_view);
  if (call.options.op == ReduceOp::kAverage && n > 1) call.space.divide(sum, numel, static_cast<float>(n), false);
  call.space.store_f32(sum, call.tensor);
  if (call.keep_gathered != nullptr && call.options.op == ReduceOp::kSum) {
    *call.keep_gathered = GatheredPayloads{std::move(gathered), std::move(sizes)};
  }
}

}  // namespace gradcomp::algorithms
