// The rank-ordered f32 sum (algorithms.h: ordered_sum_f32): alltoallv of the buffer's n pieces, piece i summed on rank
// i in rank order, allgatherv of the sums. Used where a compressed exchange sums dense f32 values (the sparse
// algorithm past its dense switch, the rounds of PowerSGD), so that fusion never changes a tensor's bits.
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace gradcomp::algorithms {

void ordered_sum_f32(Call& call, float* values, std::size_t numel) {
  const int n = call.comm.size();
  if (n <= 1 || numel == 0) return;
  const int me = call.comm.rank();
  MemorySpace& space = call.space;
  std::vector<std::size_t> piece_bytes(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) piece_bytes[i] = (piece_begin(numel, i + 1, n) - piece_begin(numel, i, n)) * sizeof(float);
  const std::size_t mine = piece_bytes[static_cast<std::size_t>(me)] / sizeof(float);
  const std::vector<std::size_t> recv_counts(static_cast<std::size_t>(n), mine * sizeof(float));

  Stopwatch watch(call.stats.communicate_s);
  const std::span<std::byte> all(reinterpret_cast<std::byte*>(values), numel * sizeof(float));
  Bytes received = space.allocate(std::max<std::size_t>(1, n * mine) * sizeof(float));
  Bytes sum = space.allocate(std::max<std::size_t>(1, mine) * sizeof(float));
  received.shrink(n * mine * sizeof(float));
  sum.shrink(mine * sizeof(float));
  space.synchronize();
  call.comm.alltoallv(all, piece_bytes, received, recv_counts, space.memory());
  const auto* pieces = reinterpret_cast<const float*>(received.data());
  auto* acc = reinterpret_cast<float*>(sum.data());
  space.copy(acc, pieces, mine * sizeof(float));
  for (int r = 1; r < n; ++r) space.add(acc, pieces + static_cast<std::size_t>(r) * mine, mine);
  space.synchronize();
  call.comm.allgatherv(sum, piece_bytes, all, space.memory());
  call.stats.wire_bytes += ring_allreduce_bytes(numel * sizeof(float), n);
}

}  // namespace gradcomp::algorithms
