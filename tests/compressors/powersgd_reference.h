// An independent PowerSGD reference for tests: plain loops in double precision over every rank's gradient at once
// (no BLAS, no LowRankOps), following Vogels et al. 2019 and PyTorch's powerSGD_hook: M_i = G_i + e_i;
// P = sum_i M_i Q; P orthonormalized (Gram-Schmidt over columns); Q = sum_i M_i^T P / n; result = P Q^T;
// e_i = M_i - P Q^T; Q kept for the next step. The initial Q is the codec's documented draw:
// uniform01(Philox(seed, fnv1a64(name), 0).bits(j * cols + c)) - 0.5 for Q^T[j][c].
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/philox_ops.cuh"

namespace gradcomp::testing {

class PowerSgdReference {
 public:
  PowerSgdReference(std::string name, std::size_t rows, std::size_t cols, std::size_t rank, int ranks, bool ef = true,
                    bool warm_start = true, std::uint64_t seed = 0)
      : name_(std::move(name)), rows_(rows), cols_(cols), rank_(rank), ranks_(ranks), ef_(ef),
        warm_start_(warm_start), seed_(seed), residual_(ranks, std::vector<double>(rows * cols, 0.0)) {}

  // grads[i] = rank i's gradient (rows x cols, row-major). Returns the average (sum when !average) over ranks.
  std::vector<double> step(const std::vector<std::vector<float>>& grads, std::uint64_t step_index, bool average = true) {
    const std::size_t n = rows_, m = cols_, r = rank_;
    if (!warm_start_ || q_.empty()) q_ = initial_q(warm_start_ ? 0 : step_index);
    std::vector<std::vector<double>> mats(ranks_, std::vector<double>(n * m));
    for (int i = 0; i < ranks_; ++i) {
      for (std::size_t e = 0; e < n * m; ++e) mats[i][e] = grads[i][e] + (ef_ ? residual_[i][e] : 0.0);
    }
    std::vector<double> p(r * n, 0.0);  // P^T: row j = column j of P
    for (int i = 0; i < ranks_; ++i) {
      for (std::size_t j = 0; j < r; ++j) {
        for (std::size_t a = 0; a < n; ++a) {
          double s = 0.0;
          for (std::size_t b = 0; b < m; ++b) s += mats[i][a * m + b] * q_[j * m + b];
          p[j * n + a] += s;
        }
      }
    }
    for (std::size_t j = 0; j < r; ++j) {
      for (std::size_t k = 0; k < j; ++k) {
        double dot = 0.0;
        for (std::size_t a = 0; a < n; ++a) dot += p[k * n + a] * p[j * n + a];
        for (std::size_t a = 0; a < n; ++a) p[j * n + a] -= dot * p[k * n + a];
      }
      double norm = 0.0;
      for (std::size_t a = 0; a < n; ++a) norm += p[j * n + a] * p[j * n + a];
      norm = std::sqrt(norm);
      for (std::size_t a = 0; a < n; ++a) p[j * n + a] = norm == 0.0 ? 0.0 : p[j * n + a] / norm;
    }
    std::vector<double> q(r * m, 0.0);  // Q^T
    for (int i = 0; i < ranks_; ++i) {
      for (std::size_t j = 0; j < r; ++j) {
        for (std::size_t b = 0; b < m; ++b) {
          double s = 0.0;
          for (std::size_t a = 0; a < n; ++a) s += p[j * n + a] * mats[i][a * m + b];
          q[j * m + b] += s;
        }
      }
    }
    for (double& v : q) v /= ranks_;
    std::vector<double> approx(n * m, 0.0);
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = 0; b < m; ++b) {
        double s = 0.0;
        for (std::size_t j = 0; j < r; ++j) s += p[j * n + a] * q[j * m + b];
        approx[a * m + b] = s;
      }
    }
    if (ef_) {
      for (int i = 0; i < ranks_; ++i) {
        for (std::size_t e = 0; e < n * m; ++e) residual_[i][e] = mats[i][e] - approx[e];
      }
    }
    q_.assign(q.begin(), q.end());
    if (!average) {
      for (double& v : approx) v *= ranks_;
    }
    return approx;
  }

  const std::vector<double>& residual(int rank) const { return residual_[rank]; }

 private:
  std::vector<double> initial_q(std::uint64_t step) const {
    const auto stream = kernels::PhiloxStream::make(seed_, kernels::fnv1a64(name_.data(), name_.size()), step);
    std::vector<double> q(rank_ * cols_);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = kernels::uniform01(stream.bits(i)) - 0.5f;
    return q;
  }

  std::string name_;
  std::size_t rows_, cols_, rank_;
  int ranks_;
  bool ef_, warm_start_;
  std::uint64_t seed_;
  std::vector<std::vector<double>> residual_;
  std::vector<double> q_;
};

// Largest |a - b| relative to the largest |b|.
inline double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale == 0.0 ? worst : worst / scale;
}

}  // namespace gradcomp::testing
