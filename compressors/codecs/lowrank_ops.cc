// The composed defaults of LowRankOps' fused passes (the CUDA ops use these; the host overrides them with one loop).
#include "compressors/codecs/lowrank_ops.h"

namespace gradcomp {

std::size_t LowRankOps::project(const float* g, const float* r, float* m, const float* q, std::size_t rank,
                                std::size_t rows, std::size_t cols, float* p, std::size_t& first) {
  const std::size_t n = rows * cols;
  const std::size_t count = count_nonfinite(g, n, first);
  if (m != g) copy(m, g, n);
  if (r != nullptr) add(m, r, n);
  gemm(false, true, rank, rows, cols, 1.0f, q, cols, m, cols, 0.0f, p, rows);
  return count;
}

void LowRankOps::begin_counts(std::size_t slots) { counts_.assign(slots, NonfiniteCount{}); }

void LowRankOps::count_nonfinite_into(const float* x, std::size_t n, std::size_t slot) {
  NonfiniteCount& c = counts_.at(slot);
  c.count = count_nonfinite(x, n, c.first);
}

std::vector<LowRankOps::NonfiniteCount> LowRankOps::read_counts() { return counts_; }

void LowRankOps::project_into(const float* g, const float* r, float* m, const float* q, std::size_t rank,
                              std::size_t rows, std::size_t cols, float* p, std::size_t slot) {
  NonfiniteCount& c = counts_.at(slot);
  c.count = project(g, r, m, q, rank, rows, cols, p, c.first);
}

void LowRankOps::reconstruct(const float* m, const float* p, const float* q, std::size_t rank, std::size_t rows,
                             std::size_t cols, float* residual, float* out, float alpha) {
  if (residual != nullptr) {
    if (residual != m) copy(residual, m, rows * cols);
    gemm(true, false, rows, cols, rank, -1.0f, p, rows, q, cols, 1.0f, residual, cols);
  }
  if (out != nullptr) gemm(true, false, rows, cols, rank, alpha, p, rows, q, cols, 0.0f, out, cols);
}

}  // namespace gradcomp
