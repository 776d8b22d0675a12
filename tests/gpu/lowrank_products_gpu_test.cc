// The CUDA LowRankOps products (gemm, orthonormalize_rows) against the host ones; tolerances as stated in
// lowrank_ops_gpu_test.cc (cuBLAS and the host BLAS sum in different orders).
#include "tests/gpu/lowrank_gpu_fixture.h"

namespace gradcomp {
namespace {

using namespace lowrank_test;  // NOLINT: the shared test data and fixture

struct GemmCase {
  bool trans_a, trans_b;
  std::size_t m, n, k;
  std::size_t pad;  // added to every leading dimension
  float alpha, beta;
};

std::string describe(const GemmCase& g) {
  return std::string(g.trans_a ? "A^T" : "A") + (g.trans_b ? " B^T" : " B") + " m=" + std::to_string(g.m) +
         " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + " pad=" + std::to_string(g.pad) +
         " alpha=" + std::to_string(g.alpha) + " beta=" + std::to_string(g.beta);
}

class LowRankGemmGpu : public LowRankOpsGpu, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(LowRankGemmGpu, AgreesWithTheHostBlas) {
  const GemmCase g = GetParam();
  const std::size_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k, lda = a_cols + g.pad;
  const std::size_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n, ldb = b_cols + g.pad;
  const std::size_t ldc = g.n + g.pad;
  const auto a = uniform_values(a_rows * lda, 10);
  const auto b = uniform_values(b_rows * ldb, 11);
  auto c0 = uniform_values(g.m * ldc, 12);
  if (g.beta == 0.0f) {  // beta = 0 must ignore C, NaN included (the padding keeps its values)
    for (std::size_t i = 0; i < g.m; ++i) {
      for (std::size_t j = 0; j < g.n; ++j) c0[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const FloatBuffer ga = to_gpu(a), gb = to_gpu(b), gc = to_gpu(c0);
  gpu_->gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, ga.data(), lda, gb.data(), ldb, g.beta, gc.data(), ldc);
  std::vector<float> cpu = c0;
  cpu_->gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta, cpu.data(), ldc);
  const auto gpu = to_host(gc);

  // Norms of op(A)'s rows and op(B)'s columns.
  std::vector<double> a_norm(g.m, 0.0), b_norm(g.n, 0.0);
  for (std::size_t r = 0; r < a_rows; ++r) {
    for (std::size_t c = 0; c < a_cols; ++c) a_norm[g.trans_a ? c : r] += double(a[r * lda + c]) * a[r * lda + c];
  }
  for (std::size_t r = 0; r < b_rows; ++r) {
    for (std::size_t c = 0; c < b_cols; ++c) b_norm[g.trans_b ? r : c] += double(b[r * ldb + c]) * b[r * ldb + c];
  }
  const double factor = 8.0 * std::sqrt(static_cast<double>(g.k)) * FLT_EPSILON;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.m; ++i) {
    for (std::size_t j = 0; j < ldc; ++j) {
      const std::size_t e = i * ldc + j;
      if (j >= g.n) {  // padding: untouched
        if (to_bits(gpu[e]) != to_bits(c0[e]) && bad++ < 5) ADD_FAILURE() << "padding written at " << i << "," << j;
        continue;
      }
      if (g.k <= 1) {
        if (to_bits(gpu[e]) != to_bits(cpu[e]) && bad++ < 5) {
          ADD_FAILURE() << "k = " << g.k << ": C(" << i << "," << j << ") gpu " << gpu[e] << " cpu " << cpu[e];
        }
        continue;
      }
      const double scale = std::fabs(g.alpha) * std::sqrt(a_norm[i] * b_norm[j]) +
                           (g.beta == 0.0f ? 0.0 : std::fabs(double(g.beta) * c0[e]));
      const double tolerance = factor * scale + FLT_MIN;
      const double diff = std::fabs(double(gpu[e]) - double(cpu[e]));
      if (!(diff <= tolerance) && bad++ < 5) {
        ADD_FAILURE() << "C(" << i << "," << j << "): gpu " << gpu[e] << " cpu " << cpu[e] << " |diff| " << diff
                      << " > " << tolerance;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << describe(g);
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  // Every transpose combination on odd sizes, tight and padded leading dimensions, beta 0 (C ignored) and not.
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      cases.push_back({ta, tb, 37, 29, 53, 0, 1.0f, 0.0f});
      cases.push_back({ta, tb, 37, 29, 53, 3, 0.7f, 1.3f});
      cases.push_back({ta, tb, 1, 1, 1, 1, -2.0f, 0.5f});
      cases.push_back({ta, tb, 1, 6144, 4096, 0, 1.0f, 0.0f});
      // k = 1 (the outer-product kernel): more columns than one block's threads, strided x and y.
      cases.push_back({ta, tb, 300, 1000, 1, 0, 1.0f, 0.0f});
      cases.push_back({ta, tb, 37, 29, 1, 3, 0.7f, 1.3f});
    }
  }
  // PowerSGD's products of a 4096 x 6144 gradient M (row-major) at ranks 1, 4 and 16, with P^T (r x 4096) and
  // Q^T (r x 6144) stored row-major: P = M Q, Q^T = P^T M, M - P Q^T.
  for (const std::size_t r : {1, 4, 16}) {
    cases.push_back({false, true, 4096, r, 6144, 0, 1.0f, 0.0f});   // P = M (Q^T)^T
    cases.push_back({false, false, r, 6144, 4096, 0, 1.0f, 0.0f});  // Q^T = P^T M
    cases.push_back({true, false, 6144, r, 4096, 0, 1.0f, 0.0f});   // Q = M^T P, P stored 4096 x r
    cases.push_back({true, false, 4096, 6144, r, 0, -1.0f, 1.0f});  // M - P Q^T, P^T stored r x 4096
  }
  // k = 0: C = beta C (beta = 0: zeros, NaN in C ignored).
  cases.push_back({false, false, 5, 7, 0, 2, 1.0f, 0.0f});
  cases.push_back({true, true, 5, 7, 0, 2, 1.0f, 0.5f});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LowRankGemmGpu, ::testing::ValuesIn(gemm_cases()),
                         [](const ::testing::TestParamInfo<GemmCase>& info) {
                           return "case" + std::to_string(info.index);
                         });

struct OrthoCase {
  std::size_t rows, cols;
  float eps;
};

class LowRankOrthoGpu : public LowRankOpsGpu, public ::testing::WithParamInterface<OrthoCase> {};

TEST_P(LowRankOrthoGpu, AgreesWithTheHostAndIsOrthonormal) {
  const OrthoCase o = GetParam();
  SCOPED_TRACE("rows = " + std::to_string(o.rows) + " cols = " + std::to_string(o.cols) +
               " eps = " + std::to_string(o.eps));
  auto v = uniform_values(o.rows * o.cols, 13 + o.rows);
  // Row 1 all zero (when there are three or more rows): it stays zero, and the rows after it ignore it.
  if (o.rows >= 3) std::fill(v.begin() + o.cols, v.begin() + 2 * o.cols, 0.0f);
  const FloatBuffer g = to_gpu(v);
  gpu_->orthonormalize_rows(g.data(), o.rows, o.cols, o.eps);
  cpu_->orthonormalize_rows(v.data(), o.rows, o.cols, o.eps);
  const auto gpu = to_host(g);

  const double tolerance = 1e-5 * std::sqrt(static_cast<double>(o.rows));
  for (std::size_t j = 0; j < o.rows; ++j) {
    double diff = 0.0;
    for (std::size_t c = 0; c < o.cols; ++c) {
      const double d = double(gpu[j * o.cols + c]) - v[j * o.cols + c];
      diff += d * d;
    }
    EXPECT_LE(std::sqrt(diff), tolerance) << "row " << j;
  }
  if (o.rows >= 3) {
    for (std::size_t c = 0; c < o.cols; ++c) ASSERT_EQ(gpu[o.cols + c], 0.0f) << "the zero row, column " << c;
  }
  // Orthonormality of the GPU's rows (where the Gram matrix is cheap to form on the host).
  if (o.rows * o.rows * o.cols <= 200'000'000) {
    for (std::size_t i = 0; i < o.rows; ++i) {
      for (std::size_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (std::size_t c = 0; c < o.cols; ++c) dot += double(gpu[i * o.cols + c]) * gpu[j * o.cols + c];
        const bool zero_row = o.rows >= 3 && (i == 1 || j == 1);
        const double expected = (i == j && !zero_row) ? 1.0 : 0.0;
        EXPECT_NEAR(dot, expected, 1e-5) << "rows " << i << ", " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LowRankOrthoGpu,
                         ::testing::Values(OrthoCase{1, 1, 0.0f}, OrthoCase{1, 7, 0.0f}, OrthoCase{2, 5, 0.0f},
                                           OrthoCase{3, 4096, 1e-8f}, OrthoCase{4, 4096, 0.0f},
                                           OrthoCase{4, 6144, 1e-8f}, OrthoCase{1, (1u << 20) + 3, 0.0f},
                                           OrthoCase{4, (1u << 20) + 3, 0.0f}, OrthoCase{7, 100003, 0.0f},
                                           OrthoCase{16, 4096, 0.0f}, OrthoCase{17, 5000, 1e-8f},
                                           OrthoCase{33, 5000, 0.0f}, OrthoCase{64, 4096, 0.0f},
                                           OrthoCase{65, 4096, 0.0f}, OrthoCase{70, 4099, 0.0f},
                                           OrthoCase{130, 3001, 0.0f}),
                         [](const ::testing::TestParamInfo<OrthoCase>& info) {
                           return "rows" + std::to_string(info.param.rows) + "_cols" +
                                  std::to_string(info.param.cols) + (info.param.eps > 0 ? "_eps" : "");
                         });

// Two host threads, each with its own stream and ops, at once: the per-thread cuBLAS handles and scratch blocks keep
// them apart, so each gets the bits a lone run gets. Also the legacy default stream (nullptr).
}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()