// The rounds algorithm, for codecs reduced in summable rounds with local computation between them (PowerSGD: the
// P round, orthonormalization, the Q round). The codec's RoundReduction produces each round's f32 contribution in
// the tensor's memory space; one rank-ordered sum per round (ordered_sum_f32: a matrix's rounds do not depend on the
// matrices batched with it) combines them; finish() writes the result.
#include "comm/algorithms/algorithms.h"
#include "gradcomp/error.h"

namespace gradcomp::algorithms {

void run_rounds(Call& call) {
  require_codec(call, call.compressor.traits().rounds, "rounds", "a rounds codec (powersgd)", "auto");
  CompressContext ctx;
  ctx.name = call.name;
  ctx.segments = call.options.segments;
  ctx.step = call.options.step;
  ctx.rank = call.comm.rank();
  ctx.world_size = call.comm.size();
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
    ordered_sum_f32(call, round.data(), round.size());
  }
  Stopwatch watch(call.stats.decompress_s);
  reduction->finish(call.options.op == ReduceOp::kAverage);
  call.stats.payload_bytes = reduction->sent_bytes();
}

}  // namespace gradcomp::algorithms
