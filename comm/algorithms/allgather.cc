// Allgather of self-describing payloads: every rank receives every payload and decodes them in rank order, so the
// sum (and the result) is bit-identical on every rank. Costs (n-1)/n of the summed payloads per rank: good for
// sparse payloads far below 1/n density.
#include <numeric>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

void run_allgather(Call& call) {
  const int n = call.comm.size();
  const std::size_t numel = call.tensor.numel();
  Bytes payload = compress_part(call, call.tensor, call.name, 1.0f, call.options.segments);
  call.stats.payload_bytes = payload.size();

  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  std::vector<std::byte> gathered;
  {
    Stopwatch watch(call.stats.communicate_s);
    const auto sizes = allgather_u64(call.comm, payload.size());
    for (int r = 0; r < n; ++r) counts[r] = static_cast<std::size_t>(sizes[r]);
    gathered.resize(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    call.comm.allgatherv(payload, counts, gathered);
  }
  call.stats.wire_bytes += ring_allgather_bytes(gathered.size(), n) + (n > 1 ? 8 * (n - 1) : 0);

  Stopwatch watch(call.stats.decompress_s);
  std::vector<float> scratch;
  float* sum = nullptr;
  if (call.tensor.dtype() == DType::kF32) {
    sum = static_cast<float*>(call.tensor.data());  // the input was consumed by compress()
  } else {
    scratch.resize(numel);
    sum = scratch.data();
  }
  const TensorView sum_view(numel ? sum : nullptr, numel, DType::kF32);
  std::size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    call.compressor.decompress(std::span(gathered).subspan(offset, counts[r]), sum_view,
                               r == 0 ? DecodeMode::kOverwrite : DecodeMode::kAccumulate);
    offset += counts[r];
  }
  if (call.options.op == ReduceOp::kAverage && n > 1) {
    const float divisor = static_cast<float>(n);
    for (std::size_t i = 0; i < numel; ++i) sum[i] /= divisor;
  }
  store_f32({sum, numel}, call.tensor);
}

}  // namespace gradcomp::algorithms
