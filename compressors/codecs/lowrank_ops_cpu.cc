// LowRankOps in host memory: plain loops (chunked over threads where they stream a whole gradient) over the element
// functions of kernels/lowrank_ops.cuh (the ones the CUDA kernels call), and the BLAS's cblas_sgemm/sgemv (OpenBLAS
// from Debian, found by CMake's FindBLAS). The CBLAS entry points are declared here with their C ABI so the build
// needs no particular cblas.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "compressors/codecs/lowrank_ops.h"
#include "gradcomp/error.h"
#include "kernels/cpu_parallel.h"
#include "kernels/half_ops.cuh"
#include "kernels/lowrank_ops.cuh"
#include "kernels/philox_ops.cuh"

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                            int lda, const float* b, int ldb, float beta, float* c, int ldc);
extern "C" void cblas_sgemv(int order, int trans, int m, int n, float alpha, const float* a, int lda, const float* x,
                            int incx, float beta, float* y, int incy);

namespace gradcomp {
namespace {

constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;
constexpr int kCblasTrans = 112;

int blas_int(std::size_t value, const char* what) {
  GRADCOMP_CHECK(value <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                 "powersgd: matrix {} {} exceeds the BLAS's 32-bit index range", what, value);
  return static_cast<int>(value);
}

void release_host(float* data, int) { delete[] data; }

class HostLowRankOps final : public LowRankOps {
 public:
  explicit HostLowRankOps(int threads) : threads_(threads) {}

  int device() const override { return -1; }

  FloatBuffer allocate(std::size_t n) override {
    if (n == 0) return {};
    return FloatBuffer(new float[n], n, -1, &release_host);
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    if (n) std::memcpy(dst, src, n * sizeof(float));
  }
  void fill_zero(float* dst, std::size_t n) override {
    if (n) std::memset(dst, 0, n * sizeof(float));
  }
  void upload(float* dst, const float* host, std::size_t n) override { copy(dst, host, n); }
  void download(float* host, const float* src, std::size_t n) override { copy(host, src, n); }

  void load_f32(const TensorView& in, std::size_t offset, std::size_t n, float* out) override {
    const auto* base = static_cast<const std::byte*>(in.data()) + offset * dtype_size(in.dtype());
    switch (in.dtype()) {
      case DType::kF32: copy(out, reinterpret_cast<const float*>(base), n); return;
      case DType::kF16: {
        const auto* bits = reinterpret_cast<const std::uint16_t*>(base);
        chunked(n, [&](std::size_t i) { out[i] = kernels::half_bits_to_float(bits[i]); });
        return;
      }
      case DType::kBF16: {
        const auto* bits = reinterpret_cast<const std::uint16_t*>(base);
        chunked(n, [&](std::size_t i) { out[i] = kernels::bf16_bits_to_float(bits[i]); });
        return;
      }
      default: throw InvalidArgument(fmt::format("powersgd: cannot read {}", in.describe()));
    }
  }

  void store_f32(const float* values, float s, const TensorView& out, std::size_t offset, std::size_t n,
                 bool accumulate) override {
    auto* base = static_cast<std::byte*>(out.data()) + offset * dtype_size(out.dtype());
    switch (out.dtype()) {
      case DType::kF32:
        if (!accumulate && s == 1.0f) {  // a copy (NaN payloads included)
          if (reinterpret_cast<float*>(base) != values) copy(reinterpret_cast<float*>(base), values, n);
          return;
        }
        return store<kernels::LowRankDType::kF32>(values, s, base, n, accumulate);
      case DType::kF16: return store<kernels::LowRankDType::kF16>(values, s, base, n, accumulate);
      case DType::kBF16: return store<kernels::LowRankDType::kBF16>(values, s, base, n, accumulate);
      default: throw InvalidArgument(fmt::format("powersgd: cannot write {}", out.describe()));
    }
  }

  void add(float* y, const float* x, std::size_t n) override {
    chunked(n, [&](std::size_t i) { y[i] += x[i]; });
  }
  void scale(float* x, std::size_t n, float s) override {
    if (s == 1.0f) return;
    chunked(n, [&](std::size_t i) { x[i] *= s; });
  }

  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
            std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // the BLAS leaves C alone when k is 0, beta included: apply it here
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      }
      return;
    }
    // Rank 1 (PowerSGD's default) is matrix-vector work: the BLAS's sgemm is 2-3x slower there than sgemv, and
    // the outer product is one streaming pass. k == 1 comes first: its element function is the CUDA kernel's too
    // (kernels/lowrank_ops.cuh), so the outer product gives the same bits in both spaces.
    if (k == 1) {
      // C (m x n) = alpha * x y^T + beta * C with x = op(A)'s column, y = op(B)'s row.
      const std::size_t x_stride = trans_a ? 1 : lda, y_stride = trans_b ? ldb : 1;
      kernels::parallel_chunks(m, 64, threads_, [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          const float xi = kernels::lowrank_outer_row(alpha, a[i * x_stride]);
          float* row = c + i * ldc;
          if (beta == 0.0f) {  // the old row is not read (NaN there is ignored)
            for (std::size_t j = 0; j < n; ++j) row[j] = kernels::lowrank_outer(xi, b[j * y_stride]);
          } else {
            for (std::size_t j = 0; j < n; ++j) row[j] = kernels::lowrank_outer(xi, b[j * y_stride], beta, row[j]);
          }
        }
      });
      return;
    }
    if (m == 1) {
      // C (1 x n) = alpha * a (1 x k) * op(B) + beta * C, i.e. y = op(B)^T a.
      cblas_sgemv(kCblasRowMajor, trans_b ? kCblasNoTrans : kCblasTrans, blas_int(trans_b ? n : k, "rows"),
                  blas_int(trans_b ? k : n, "columns"), alpha, b, blas_int(ldb, "leading dimension"), a,
                  blas_int(trans_a ? lda : 1, "stride"), beta, c, 1);
      return;
    }
    cblas_sgemm(kCblasRowMajor, trans_a ? kCblasTrans : kCblasNoTrans, trans_b ? kCblasTrans : kCblasNoTrans,
                blas_int(m, "rows"), blas_int(n, "columns"), blas_int(k, "inner dimension"), alpha, a,
                blas_int(lda, "leading dimension"), b, blas_int(ldb, "leading dimension"), beta, c,
                blas_int(ldc, "leading dimension"));
  }

  void orthonormalize_rows(float* v, std::size_t rows, std::size_t cols, float eps) override {
    for (std::size_t j = 0; j < rows; ++j) {
      float* row = v + j * cols;
      for (std::size_t i = 0; i < j; ++i) {
        const float* prior = v + i * cols;
        const float projection = static_cast<float>(dot(prior, row, cols));
        for (std::size_t e = 0; e < cols; ++e) row[e] -= projection * prior[e];
      }
      const float norm = static_cast<float>(std::sqrt(dot(row, row, cols)));
      const float divisor = norm + eps;
      if (divisor == 0.0f) {
        fill_zero(row, cols);
      } else {
        for (std::size_t e = 0; e < cols; ++e) row[e] /= divisor;
      }
    }
  }

  std::size_t count_nonfinite(const float* x, std::size_t n, std::size_t& first) override {
    // A branch-free count (vectorizes); the first index only when there is one.
    std::size_t count = 0;
    for (std::size_t i = 0; i < n; ++i) count += kernels::lowrank_nonfinite(x[i]);
    first = n;
    for (std::size_t i = 0; count > 0 && i < n; ++i) {
      if (kernels::lowrank_nonfinite(x[i])) {
        first = i;
        break;
      }
    }
    return count;
  }
  void zero_nonfinite(float* x, std::size_t n) override {
    chunked(n, [&](std::size_t i) {
      if (kernels::lowrank_nonfinite(x[i])) x[i] = 0.0f;
    });
  }
  void fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step) override {
    const auto stream = kernels::PhiloxStream::make(seed, key, step);
    for (std::size_t i = 0; i < n; ++i) x[i] = kernels::lowrank_random(stream.bits(i));
  }

  void synchronize() override {}

  // One pass over g and r per row: the NaN/Inf count, m = g + r, and the row's rank dot products with q (the row is
  // still in cache for them). Rows are cut into fixed chunks: the results do not depend on the thread count.
  std::size_t project(const float* g, const float* r, float* m, const float* q, std::size_t rank, std::size_t rows,
                      std::size_t cols, float* p, std::size_t& first) override {
    const std::size_t chunk_rows = row_chunk(cols);
    const std::size_t chunks = rows == 0 ? 0 : (rows + chunk_rows - 1) / chunk_rows;
    std::vector<std::size_t> counts(chunks, 0), firsts(chunks, rows * cols);
    kernels::parallel_chunks(rows, chunk_rows, threads_, [&](std::size_t k, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const float* gi = g + i * cols;
        float* mi = m + i * cols;
        const auto* bits = reinterpret_cast<const std::uint32_t*>(gi);
        std::size_t bad = 0;
        for (std::size_t c = 0; c < cols; ++c) bad += (bits[c] & 0x7f800000u) == 0x7f800000u;
        if (bad > 0 && counts[k] == 0) {
          for (std::size_t c = 0; c < cols; ++c) {
            if (!std::isfinite(gi[c])) {
              firsts[k] = i * cols + c;
              break;
            }
          }
        }
        counts[k] += bad;
        if (r != nullptr) {
          const float* ri = r + i * cols;
          for (std::size_t c = 0; c < cols; ++c) mi[c] = gi[c] + ri[c];
        } else if (mi != gi) {
          std::memcpy(mi, gi, cols * sizeof(float));
        }
        for (std::size_t j = 0; j < rank; ++j) p[j * rows + i] = static_cast<float>(dot_lanes(mi, q + j * cols, cols));
      }
    });
    std::size_t total = 0;
    first = rows * cols;
    for (std::size_t k = 0; k < chunks; ++k) {
      total += counts[k];
      first = std::min(first, firsts[k]);
    }
    return total;
  }

  // One pass per row: s = p^T q for the row (rank terms), residual = m - s, out = alpha * s.
  void reconstruct(const float* m, const float* p, const float* q, std::size_t rank, std::size_t rows,
                   std::size_t cols, float* residual, float* out, float alpha) override {
    kernels::parallel_chunks(rows, row_chunk(cols), threads_, [&](std::size_t, std::size_t begin, std::size_t end) {
      std::vector<float> s(rank > 1 ? cols : 0);
      for (std::size_t i = begin; i < end; ++i) {
        const float* mi = m + i * cols;
        float* ri = residual ? residual + i * cols : nullptr;
        float* oi = out ? out + i * cols : nullptr;
        if (rank == 1) {
          const float pi = p[i];
          for (std::size_t c = 0; c < cols; ++c) {
            const float si = pi * q[c];
            const float mc = mi[c];
            if (ri) ri[c] = mc - si;
            if (oi) oi[c] = alpha * si;
          }
          continue;
        }
        const float p0 = p[i];
        for (std::size_t c = 0; c < cols; ++c) s[c] = p0 * q[c];
        for (std::size_t j = 1; j < rank; ++j) {
          const float pj = p[j * rows + i];
          const float* qj = q + j * cols;
          for (std::size_t c = 0; c < cols; ++c) s[c] += pj * qj[c];
        }
        for (std::size_t c = 0; c < cols; ++c) {
          const float mc = mi[c];
          if (ri) ri[c] = mc - s[c];
          if (oi) oi[c] = alpha * s[c];
        }
      }
    });
  }

 private:
  // Rows per parallel chunk: about kParallelChunk elements, independent of the thread count.
  static std::size_t row_chunk(std::size_t cols) {
    return std::max<std::size_t>(1, kernels::kParallelChunk / std::max<std::size_t>(cols, 1));
  }
  // a . b with 8 float lanes summed in order, then the lanes and the tail in double (vectorizes; fixed order).
  static double dot_lanes(const float* a, const float* b, std::size_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::size_t c = 0;
    for (; c + 8 <= n; c += 8) {
      for (int l = 0; l < 8; ++l) lane[l] += a[c + l] * b[c + l];
    }
    double sum = 0.0;
    for (float value : lane) sum += value;
    for (; c < n; ++c) sum += static_cast<double>(a[c]) * static_cast<double>(b[c]);
    return sum;
  }
  // out[i] (=, or += when accumulate) s * values[i] in D, i < n (kernels::lowrank_store).
  template <kernels::LowRankDType D>
  void store(const float* values, float s, std::byte* out, std::size_t n, bool accumulate) {
    auto* dst = reinterpret_cast<kernels::LowRankElement<D>*>(out);
    if (accumulate) {
      chunked(n, [&](std::size_t i) { kernels::lowrank_store<D>(dst[i], values[i], s, true); });
    } else {
      chunked(n, [&](std::size_t i) { kernels::lowrank_store<D>(dst[i], values[i], s, false); });
    }
  }
  // Sum of a[i] * b[i] in double (the order is fixed: results do not depend on threads).
  static double dot(const float* a, const float* b, std::size_t n) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return sum;
  }
  template <typename Fn>
  void chunked(std::size_t n, Fn&& fn) {
    kernels::parallel_chunks(n, kernels::kParallelChunk, threads_, [&](std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) fn(i);
    });
  }

  int threads_;
};

}  // namespace

std::unique_ptr<LowRankOps> host_lowrank_ops(int threads) { return std::make_unique<HostLowRankOps>(threads); }

}  // namespace gradcomp
