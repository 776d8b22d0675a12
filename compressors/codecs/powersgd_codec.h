// Internals of the powersgd codec (compressors/codecs/powersgd.h): its parameters, per-tensor state, and the one step that
// both compressed_allreduce's rounds algorithm (PowerSgdReduction) and the one-rank compress() run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compressors/framework/ef_flow.h"
#include "compressors/framework/error_feedback.h"
#include "compressors/codecs/lowrank_ops.h"
#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"

namespace gradcomp::powersgd {

struct Options {
  std::size_t rank = 1;
  bool warm_start = true;
  std::uint64_t start_step = 0;
  double min_compression_rate = 2.0;
  float orth_eps = 0.0f;
  std::uint64_t seed = 0;
  bool ef = true;
  NonFinitePolicy nonfinite = NonFinitePolicy::kRaise;
};

// One tensor's state, in the memory space of the last call that used it (host, or one CUDA device).
//
// Streams: a step on a CUDA tensor queues its work on the tensor's stream (the LowRankOps that begin_rounds() makes
// for it), and nothing in the step waits for all of it. compressed_allreduce synchronizes that stream before it
// returns (space.synchronize() at the end of compressed_allreduce, comm/algorithms/compressed_allreduce.cc, on the
// memory space made for the same tensor, hence the same stream; run_rounds also synchronizes before each round's
// allreduce); the residuals change only when a step completes, and a reduction that ends early (a failed round)
// waits for its queued work in its destructor, so the state is complete when compressed_allreduce returns or throws.
// That is what save_state()
// and relocate() rely on: they read the buffers through other ops (the device's legacy default stream, which does
// not wait for a non-blocking stream), and a later step may run on another stream. Code that drives
// begin_rounds() itself must synchronize the tensor's stream before either. compress() takes host tensors only (it
// throws for CUDA tensors), so it leaves nothing queued; a CUDA compress() would have to download the factors
// before writing the payload and synchronize before it returns.
struct TensorState {
  std::uint64_t numel = 0;
  std::uint64_t rows = 0;
  std::uint64_t steps = 0;
  int device = -1;         // -1: host
  // numel values (ef=on and compressed at least once); changed only when a step completes.
  FloatBuffer residual;
  FloatBuffer q;           // rank x cols: Q^T, the warm start
  bool q_valid = false;    // q holds the last step's averaged Q (else it is drawn afresh)
};

using StateMap = std::map<std::string, TensorState, std::less<>>;

// How one tensor (a segment of the call) travels.
struct Block {
  std::string name;
  std::size_t offset = 0;  // in the call's tensor
  std::size_t numel = 0;
  std::size_t start = 0, total = 0;     // the segment's place in its tensor (a chunk of a vector)
  std::uint64_t step = kStepOfCall;     // the segment's own step (the non-finite message names it)
  std::size_t rows = 0, cols = 0;
  std::size_t rank = 0;     // 0: uncompressed (its values ride in the first round)
  bool skipped = false;     // nonfinite=skip found NaN/Inf: contributes zeros, state untouched
  bool nonfinite = false;   // NaN/Inf present (nonfinite=pass)
  TensorState* state = nullptr;  // compressed blocks only
  const float* grad = nullptr;   // f32 values of the block (the tensor's own memory when it is f32)
  float* matrix = nullptr;       // M = G + residual (compressed blocks): in the tensor's memory or the f32 scratch
  std::size_t p_offset = 0;      // compressed: P^T (rank x rows) in round one; uncompressed: the values there
  std::size_t q_offset = 0;      // compressed: Q^T (rank x cols) in round two
};

// Per-space scratch of one codec instance, grown to the largest call and reused.
struct Scratch {
  FloatBuffer round1, round2, values;
};

// One step over a tensor made of blocks: build, then round one (P and the uncompressed values), round two (Q),
// then write the result and commit the state. Used by the rounds algorithm with world_size ranks, and by
// compress() with one.
class Step {
 public:
  // Plans the blocks of `tensor` (segments of ctx, or the whole tensor under ctx.name with tensor.rows()), finds or
  // creates their state, scans for NaN/Inf (raise throws here, before any state changes) and computes round one.
  // `tensor_writable`: M and the result may be written into the tensor (the rounds; compress() passes false and
  // an f32 tensor's M goes to the scratch instead).
  Step(const Options& options, StateMap& states, Scratch& scratch, LowRankOps& ops, const TensorView& tensor,
       const CompressContext& ctx, bool tensor_writable);
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  std::span<float> round1() { return {round1_, round1_size_}; }
  std::span<float> round2() { return {round2_, round2_size_}; }
  bool has_round2() const { return round2_size_ > 0; }
  // After round one was summed: orthonormalize each P and compute Q^T = P^T M into round two.
  void compute_round2();
  // The factors (P^T, Q^T of each compressed block) and uncompressed values, for the one-rank payload.
  const std::vector<Block>& blocks() const { return blocks_; }
  // After the last round: Q averaged over world_size and kept for the warm start, residual = M - P Q_avg^T, steps
  // counted; with `average` set, the result P Q^T (times world_size for a sum) and the uncompressed values (divided
  // by world_size for an average) are written into the tensor. Call once.
  void complete(std::optional<bool> average);
  std::size_t sent_floats() const { return round1_size_ + round2_size_; }

 private:
  void plan(const TensorView& tensor, const CompressContext& ctx);
  void prepare_state(Block& block);
  void scan_uncompressed(const CompressContext& ctx);
  // The non-finite policy for `count` NaN/Inf in a block (first at `first` of `values`): raise throws naming it.
  // Through the verdicts every codec's flow uses (compressors/framework/ef_flow.h).
  void apply_policy(Block& block, std::size_t count, std::size_t first, const float* values,
                    const CompressContext& ctx);
  // The kept blocks' states made current (pass: non-finite residual entries reset) and their steps counted, through
  // SegmentVerdicts::commit.
  void commit_states();
  void build_round1(const CompressContext& ctx);
  void average_q();

  const Options& options_;
  StateMap& states_;
  Scratch& scratch_;
  LowRankOps& ops_;
  TensorView tensor_;
  std::uint64_t step_ = 0;
  std::uint64_t seed_key_ = 0;
  int world_size_ = 1;
  bool compress_ = true;  // false before start_step
  std::vector<Block> blocks_;
  std::vector<TensorSegment> segments_;     // one per block (names viewing the blocks'), for verdicts_
  std::optional<SegmentVerdicts> verdicts_;  // made after plan()
  float* round1_ = nullptr;
  float* round2_ = nullptr;
  std::size_t round1_size_ = 0, round2_size_ = 0;
  bool averaged_q_ = false;
  bool tensor_writable_ = true;
};

// The rank a block of rows x cols gets (0: uncompressed: a vector, 1 x n or n x 1, or a matrix that would not shrink
// by min_compression_rate), or throws InvalidArgument naming `name` when options.rank >= min(rows, cols) >= 2.
std::size_t block_rank(const Options& options, std::string_view name, std::size_t rows, std::size_t cols, int rank);

}  // namespace gradcomp::powersgd
