// One PowerSGD step over the blocks of a tensor, written once against LowRankOps (host BLAS or CUDA/cuBLAS).
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "compressors/framework/ef_flow.h"
#include "compressors/codecs/powersgd_codec.h"
#include "compressors/framework/segments.h"
#include "gradcomp/error.h"
#include "kernels/fnv1a.cuh"

namespace gradcomp::powersgd {
namespace {

std::uint64_t key_of(std::string_view name) { return kernels::fnv1a64(name.data(), name.size()); }

// Grow-only scratch: `buffer` holds at least n floats afterwards (old contents lost when it grows).
float* reserve(LowRankOps& ops, FloatBuffer& buffer, std::size_t n) {
  if (buffer.size() < n) buffer = ops.allocate(n);
  return buffer.data();
}

// The state's buffers moved into the space of `target` (through host memory) when they live elsewhere.
void relocate(TensorState& state, LowRankOps& target) {
  if (state.device == target.device()) return;
  auto source = state.device < 0 ? host_lowrank_ops(1)
                                 : cuda_lowrank_ops(TensorView(nullptr, 0, DType::kF32, Device::cuda(state.device)));
  for (FloatBuffer* buffer : {&state.residual, &state.q}) {
    if (buffer->empty()) continue;
    std::vector<float> host(buffer->size());
    source->download(host.data(), buffer->data(), host.size());
    FloatBuffer moved = target.allocate(host.size());
    target.upload(moved.data(), host.data(), host.size());
    *buffer = std::move(moved);
  }
  state.device = target.device();
}

}  // namespace

std::size_t block_rank(const Options& options, std::string_view name, std::size_t rows, std::size_t cols, int rank) {
  // A vector, also one shaped 1 x n or n x 1 (a Linear layer with one output), travels uncompressed.
  if (rows <= 1 || cols <= 1) return 0;
  const std::size_t r = options.rank;
  GRADCOMP_CHECK(r < std::min(rows, cols),
                 "powersgd: rank {} is not below min(rows, cols) of tensor '{}' ({}x{}) on rank {}: use a rank below "
                 "{} (PyTorch's hook lowers the rank silently; gradcomp asks)",
                 r, name, rows, cols, rank, std::min(rows, cols));
  const double compressed = static_cast<double>(r) * static_cast<double>(rows + cols);
  const double dense = static_cast<double>(rows) * static_cast<double>(cols);
  if (!(compressed * options.min_compression_rate < dense)) return 0;
  return r;
}

Step::Step(const Options& options, StateMap& states, Scratch& scratch, LowRankOps& ops, const TensorView& tensor,
           const CompressContext& ctx, bool tensor_writable)
    : options_(options), states_(states), scratch_(scratch), ops_(ops), tensor_(tensor),
      tensor_writable_(tensor_writable) {
  GRADCOMP_CHECK(!ctx.name.empty(), "powersgd: the tensor name must not be empty (rank {})", ctx.rank);
  GRADCOMP_CHECK(ctx.world_size >= 1, "powersgd('{}'): world_size must be >= 1, got {}", ctx.name, ctx.world_size);
  GRADCOMP_CHECK(tensor.dtype() == DType::kF32 || tensor.dtype() == DType::kF16 || tensor.dtype() == DType::kBF16,
                 "powersgd('{}'): tensor must be f32, f16 or bf16, got {} on rank {}", ctx.name, tensor.describe(),
                 ctx.rank);
  step_ = ctx.step;
  seed_key_ = options.seed;
  world_size_ = ctx.world_size;
  compress_ = ctx.step >= options.start_step;
  try {
    plan(tensor, ctx);
    for (const Block& b : blocks_) {
      segments_.push_back(TensorSegment{b.name, b.offset, b.numel, b.start, b.total, b.rows, b.step});
    }
    verdicts_.emplace("powersgd", options_.nonfinite, segments_);
    scan_uncompressed(ctx);
    for (Block& block : blocks_) {
      if (block.rank > 0) prepare_state(block);
    }
    build_round1(ctx);
  } catch (...) {
    // Refused before any state changed (the residuals change only on commit); an f16/bf16 conversion or a pass may
    // still be queued into the per-device scratch that the next call (perhaps on another stream) reuses: finish it.
    ops_.synchronize();
    throw;
  }
}

void Step::plan(const TensorView& tensor, const CompressContext& ctx) {
  // The segment rules every codec shares (compressors/framework/segments.h); a call without segments is the whole tensor,
  // shaped by tensor.rows().
  std::vector<TensorSegment> segments = resolve_segments(ctx, tensor.numel(), "powersgd");
  if (ctx.segments.empty()) segments[0].rows = tensor.rows();
  const float* values = nullptr;
  if (tensor.dtype() == DType::kF32) {
    values = static_cast<const float*>(tensor.data());
  } else {
    float* converted = reserve(ops_, scratch_.values, tensor.numel());
    ops_.load_f32(tensor, 0, tensor.numel(), converted);
    values = converted;
  }
  for (const TensorSegment& segment : segments) {
    // Vectors travel uncompressed, so a part of one is fine; a matrix must come whole.
    GRADCOMP_CHECK(segment.rows == 0 || is_whole(segment),
                   "powersgd compresses whole matrices, but tensor '{}' arrives as elements [{}, {}) of {} on rank {} "
                   "(a chunked algorithm such as sra: use auto, rounds or allgather)",
                   segment.name, segment.start, segment.start + segment.numel, segment.total, ctx.rank);
    GRADCOMP_CHECK(segment.rows == 0 || segment.numel % segment.rows == 0,
                   "powersgd: tensor '{}' has {} elements, not a multiple of its {} rows (rank {})", segment.name,
                   segment.numel, segment.rows, ctx.rank);
    Block block;
    block.name = std::string(segment.name);
    block.offset = segment.offset;
    block.numel = segment.numel;
    block.start = segment.start;
    block.total = segment.total;
    block.step = segment.step;
    block.rows = segment.rows;
    block.cols = segment.rows == 0 ? 0 : segment.numel / segment.rows;
    // The shape is checked on every step (also before start_step), so a rank too large for a tensor shows at once.
    block.rank = block_rank(options_, block.name, block.rows, block.cols, ctx.rank);
    if (!compress_) block.rank = 0;
    block.grad = values + segment.offset;
    if (block.rank > 0) {
      auto found = states_.find(block.name);
      if (found != states_.end() && found->second.numel != 0) {
        const TensorState& state = found->second;
        GRADCOMP_CHECK(state.numel == block.numel && state.rows == block.rows,
                       "powersgd: tensor '{}' is {}x{} on rank {}, but its state was kept for {} elements in {} rows",
                       block.name, block.rows, block.cols, ctx.rank, state.numel, state.rows);
      }
    }
    blocks_.push_back(std::move(block));
  }
}

void Step::scan_uncompressed(const CompressContext& ctx) {
  // Compressed blocks are scanned by LowRankOps::project_into in their first pass (build_round1). One wait for all
  // the vectors (before any state is prepared: raise leaves even a new tensor without state).
  std::vector<Block*> vectors;
  for (Block& block : blocks_) {
    if (block.rank == 0) vectors.push_back(&block);
  }
  if (vectors.empty()) return;
  ops_.begin_counts(vectors.size());
  for (std::size_t v = 0; v < vectors.size(); ++v) ops_.count_nonfinite_into(vectors[v]->grad, vectors[v]->numel, v);
  const auto counts = ops_.read_counts();
  for (std::size_t v = 0; v < vectors.size(); ++v) {
    apply_policy(*vectors[v], counts[v].count, counts[v].first, vectors[v]->grad, ctx);
  }
}

void Step::apply_policy(Block& block, std::size_t count, std::size_t first, const float* values,
                        const CompressContext& ctx) {
  const auto s = static_cast<std::size_t>(&block - blocks_.data());
  verdicts_->note(s, count, ctx, [&] {
    float value = 0.0f;
    ops_.download(&value, values + first, 1);
    return std::pair{first, value};
  });
  block.skipped = verdicts_->zero(s);
  block.nonfinite = verdicts_->zero(s) || verdicts_->dirty(s);
}

void Step::prepare_state(Block& block) {
  TensorState& state = states_[block.name];
  relocate(state, ops_);
  state.device = ops_.device();
  state.numel = block.numel;
  state.rows = block.rows;
  block.state = &state;
  const std::size_t q_size = block.rank * block.cols;
  if (state.q.size() != q_size) {
    state.q = ops_.allocate(q_size);
    state.q_valid = false;
  }
  if (!options_.warm_start || !state.q_valid) {
    // A fresh start: the same draw on every rank (keyed by the tensor name; by the step too without warm start).
    ops_.fill_random(state.q.data(), q_size, seed_key_, key_of(block.name), options_.warm_start ? 0 : step_);
  }
  if (options_.ef) {
    if (state.residual.size() != block.numel) {
      state.residual = ops_.allocate(block.numel);
      ops_.fill_zero(state.residual.data(), block.numel);
    }
  }
}

void Step::build_round1(const CompressContext& ctx) {
  std::size_t cursor = 0, cursor2 = 0;
  for (Block& block : blocks_) {
    if (block.rank == 0) continue;
    block.p_offset = cursor;
    cursor += block.rank * block.rows;
    block.q_offset = cursor2;
    cursor2 += block.rank * block.cols;
  }
  for (Block& block : blocks_) {
    if (block.rank > 0) continue;
    block.p_offset = cursor;
    cursor += block.numel;
  }
  round1_size_ = cursor;
  round2_size_ = cursor2;
  round1_ = reserve(ops_, scratch_.round1, round1_size_);
  round2_ = reserve(ops_, scratch_.round2, round2_size_);
  std::vector<Block*> matrices;
  for (Block& block : blocks_) {
    float* p = round1_ + block.p_offset;
    if (block.rank == 0) {
      if (block.skipped) {
        ops_.fill_zero(p, block.numel);
      } else {
        ops_.copy(p, block.grad, block.numel);
      }
      continue;
    }
    matrices.push_back(&block);
  }
  if (matrices.empty()) return;
  // One pass per matrix: the NaN/Inf count of G, M, and P^T (rank x rows) = Q^T (rank x cols) * M^T; the counts of
  // every matrix come back with one wait.
  ops_.begin_counts(matrices.size());
  for (std::size_t b = 0; b < matrices.size(); ++b) {
    Block& block = *matrices[b];
    // M = G + residual goes where the result will be written (the tensor's own memory, or the f32 scratch of an
    // f16/bf16 tensor or of a tensor that compress() must not change); the residual changes only on commit.
    float* m = const_cast<float*>(block.grad);
    if (!tensor_writable_ && tensor_.dtype() == DType::kF32) {
      m = reserve(ops_, scratch_.values, tensor_.numel()) + block.offset;
    }
    ops_.project_into(block.grad, options_.ef ? block.state->residual.data() : nullptr, m, block.state->q.data(),
                      block.rank, block.rows, block.cols, round1_ + block.p_offset, b);
    block.matrix = m;
  }
  const auto counts = ops_.read_counts();
  for (std::size_t b = 0; b < matrices.size(); ++b) {
    Block& block = *matrices[b];
    apply_policy(block, counts[b].count, counts[b].first, block.matrix, ctx);
    if (block.skipped) ops_.fill_zero(round1_ + block.p_offset, block.rank * block.rows);
  }
}

void Step::compute_round2() {
  for (Block& block : blocks_) {
    if (block.rank == 0) continue;
    float* p = round1_ + block.p_offset;
    float* q = round2_ + block.q_offset;
    ops_.orthonormalize_rows(p, block.rank, block.rows, options_.orth_eps);
    if (block.skipped) {
      ops_.fill_zero(q, block.rank * block.cols);
      continue;
    }
    // Q^T (rank x cols) = P^T (rank x rows) * M.
    ops_.gemm(false, false, block.rank, block.cols, block.rows, 1.0f, p, block.rows, block.matrix, block.cols, 0.0f, q,
              block.cols);
  }
}

void Step::average_q() {
  if (averaged_q_) return;
  averaged_q_ = true;
  ops_.scale(round2_, round2_size_, 1.0f / static_cast<float>(world_size_));
}

void Step::complete(std::optional<bool> average) {
  average_q();
  const float n = static_cast<float>(world_size_);
  // Every rank holds the same averaged Q; a non-finite one (nonfinite=pass) is drawn afresh next step. The checks of
  // every matrix come back with one wait.
  std::vector<LowRankOps::NonfiniteCount> q_counts;
  const bool any_matrix = std::any_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.rank > 0; });
  if (options_.warm_start && any_matrix) {
    ops_.begin_counts(blocks_.size());
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      if (blocks_[b].rank > 0) {
        ops_.count_nonfinite_into(round2_ + blocks_[b].q_offset, blocks_[b].rank * blocks_[b].cols, b);
      }
    }
    q_counts = ops_.read_counts();
  }
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    Block& block = blocks_[b];
    if (block.rank == 0) {
      if (average) {
        ops_.store_f32(round1_ + block.p_offset, *average ? 1.0f / n : 1.0f, tensor_, block.offset, block.numel,
                       false);
      }
      continue;
    }
    TensorState& state = *block.state;
    const float* p = round1_ + block.p_offset;
    const float* q = round2_ + block.q_offset;
    const std::size_t q_size = block.rank * block.cols;
    if (options_.warm_start) {
      state.q_valid = q_counts[b].count == 0;
      if (state.q_valid) ops_.copy(state.q.data(), q, q_size);
    }
    // One pass: residual = M - P Q_avg^T (ef=on, not skipped) and the result P Q^T (times n for a sum) into M's
    // place, which is the tensor's memory or the f32 scratch of an f16/bf16 tensor.
    float* residual = options_.ef && !block.skipped ? state.residual.data() : nullptr;
    float* out = average ? block.matrix : nullptr;
    if (residual != nullptr || out != nullptr) {
      ops_.reconstruct(block.matrix, p, q, block.rank, block.rows, block.cols, residual, out,
                       average && !*average ? n : 1.0f);
    }
    if (out != nullptr && tensor_.dtype() != DType::kF32) {
      ops_.store_f32(out, 1.0f, tensor_, block.offset, block.numel, false);
    }
  }
  commit_states();
}

namespace {

// PowerSGD's side of the commit: reconstruct() has written a kept block's new residual in place; nonfinite=pass
// resets its non-finite entries.
class ResidualCommit final : public StateCommit {
 public:
  ResidualCommit(LowRankOps& ops, const std::vector<Block>& blocks, bool ef) : ops_(ops), blocks_(blocks), ef_(ef) {}
  void commit(std::size_t s, bool dirty) override {
    const Block& block = blocks_[s];
    if (dirty && ef_ && block.rank > 0) ops_.zero_nonfinite(block.state->residual.data(), block.numel);
  }

 private:
  LowRankOps& ops_;
  const std::vector<Block>& blocks_;
  bool ef_;
};

}  // namespace

void Step::commit_states() {
  std::vector<std::uint64_t*> steps(blocks_.size(), nullptr);
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    if (blocks_[b].rank > 0) steps[b] = &blocks_[b].state->steps;
  }
  ResidualCommit store(ops_, blocks_, options_.ef);
  verdicts_->commit(store, steps);
}

}  // namespace gradcomp::powersgd
