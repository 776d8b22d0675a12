// Sparse allreduce with a dense switch (after SparCML, Renggli et al. 2019). Each rank turns what its compressor
// transmitted into (index, value) pairs (decode into a scratch dense buffer, scan the nonzeros), and the ranks agree
// on the total count first: while the pairs are cheaper than a dense ring allreduce they are allgathered and added in
// rank order (kAverage: each value divided by n as it is added); past the break-even density the decoded tensors are
// summed with a dense f32 allreduce instead.
#include <cstdint>
#include <cstring>
#include <memory>
#include <limits>
#include <numeric>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {
namespace {

struct Pair {
  std::uint32_t index;
  float value;
};
static_assert(sizeof(Pair) == 8);

}  // namespace

void run_sparse(Call& call) {
  const int n = call.comm.size();
  const std::size_t numel = call.tensor.numel();
  Bytes payload = compress_part(call, call.tensor, call.name, 1.0f);
  call.stats.payload_bytes = payload.size();

  std::unique_ptr<float[]> dense_storage(new float[numel > 0 ? numel : 1]);  // fully written by decompress
  const std::span<float> dense(dense_storage.get(), numel);
  std::vector<Pair> pairs;
  {
    Stopwatch watch(call.stats.decompress_s);
    call.compressor.decompress(payload, TensorView(numel ? dense.data() : nullptr, numel, DType::kF32),
                               DecodeMode::kOverwrite);
    for (std::size_t i = 0; i < numel; ++i) {
      if (dense[i] != 0.0f) pairs.push_back({static_cast<std::uint32_t>(i), dense[i]});
    }
  }

  std::vector<std::uint64_t> nnz;
  {
    Stopwatch watch(call.stats.communicate_s);
    nnz = allgather_u64(call.comm, pairs.size());
  }
  const std::uint64_t total = std::accumulate(nnz.begin(), nnz.end(), std::uint64_t{0});
  const bool go_dense = numel > std::numeric_limits<std::uint32_t>::max() ||
                        static_cast<double>(total) > call.options.sparse_switch_density * static_cast<double>(numel);
  call.stats.wire_bytes += n > 1 ? 8 * (n - 1) : 0;
  call.stats.switched_to_dense = go_dense;

  if (go_dense) {
    {
      Stopwatch watch(call.stats.communicate_s);
      call.comm.allreduce(TensorView(numel ? dense.data() : nullptr, numel, DType::kF32), ReduceOp::kSum);
    }
    call.stats.wire_bytes += ring_allreduce_bytes(numel * sizeof(float), n);
  } else {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) counts[r] = static_cast<std::size_t>(nnz[r]) * sizeof(Pair);
    std::vector<Pair> gathered(total);
    {
      Stopwatch watch(call.stats.communicate_s);
      call.comm.allgatherv(std::as_bytes(std::span(pairs)), counts, std::as_writable_bytes(std::span(gathered)));
    }
    call.stats.wire_bytes += ring_allgather_bytes(total * sizeof(Pair), n);
    Stopwatch watch(call.stats.decompress_s);
    // Sum straight into the tensor when it is f32 (its input was consumed by compress()); only touched entries are
    // written after the clear, and kAverage divides each pair's value, so no further pass over the dense tensor.
    float* sum = call.tensor.dtype() == DType::kF32 ? static_cast<float*>(call.tensor.data()) : dense.data();
    if (numel > 0) std::memset(sum, 0, numel * sizeof(float));
    const float divisor = call.options.op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
    std::size_t union_nnz = 0;
    for (const Pair& pair : gathered) {
      GRADCOMP_CHECK_AS(CommError, pair.index < numel,
                        "compressed_allreduce('{}'): sparse pair index {} out of range of {} elements (rank {})",
                        call.name, pair.index, numel, call.comm.rank());
      union_nnz += sum[pair.index] == 0.0f;
      sum[pair.index] += pair.value / divisor;
    }
    call.stats.union_nnz = union_nnz;
    if (sum == dense.data()) store_f32(dense, call.tensor);
    return;
  }

  Stopwatch watch(call.stats.decompress_s);
  if (call.options.op == ReduceOp::kAverage && n > 1) {
    const float divisor = static_cast<float>(n);
    for (float& value : dense) value /= divisor;
  }
  store_f32(dense, call.tensor);
}

}  // namespace gradcomp::algorithms
