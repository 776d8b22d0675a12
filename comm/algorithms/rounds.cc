// The rounds algorithm, for codecs reduced in summable rounds with local computation between them (PowerSGD: the
// P round, orthonormalization, the Q round). The codec's RoundReduction produces each round's f32 contribution in
// the tensor's memory space; one allreduce (sum) per round combines them; finish() writes the result.
#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

void run_rounds(Call& call) {
  require_codec(call, call.compressor.traits().rounds, "rounds", "a rounds codec (powersgd)", "auto");
  const int n = call.comm.size();
  CompressContext ctx;
  ctx.name = call.name;
  ctx.segments = call.options.segments;
  ctx.step = call.options.step;
  ctx.rank = call.comm.rank();
  ctx.world_size = n;
  std::unique_ptr<RoundReduction> reduction;
  {
    Stopwatch watch(call.stats.compress_s);
    reduction = call.compressor.begin_rounds(call.tensor, ctx);
  }
  for (;;) {
    std::span<float> round;
    {
      Stopwatch watch(call.stats.compress_s);
      round = reduction->next_round();
    }
    if (round.empty()) break;
    Stopwatch watch(call.stats.communicate_s);
    call.space.synchronize();
    call.comm.allreduce(call.space.view(round.data(), round.size(), DType::kF32), ReduceOp::kSum);
    call.stats.wire_bytes += ring_allreduce_bytes(round.size_bytes(), n);
  }
  Stopwatch watch(call.stats.decompress_s);
  reduction->finish(call.options.op == ReduceOp::kAverage);
  call.stats.payload_bytes = reduction->sent_bytes();
}

}  // namespace gradcomp::algorithms
