// The CUDA LowRankOps (compressors/lowrank_ops_cuda.cc) against the host ones (host_lowrank_ops(1)), operation by
// operation, on the same data, on a non-blocking stream.
//
// Bits: copy, fill_zero, load_f32, zero_nonfinite, count_nonfinite and fill_random give the host's bits exactly;
// add, scale and store_f32 too, except that a NaN result only has to be a NaN (a GPU's arithmetic returns the
// canonical NaN 0x7FFFFFFF where x86 keeps the operand's sign and payload).
// Tolerances (cuBLAS and the host BLAS sum in different orders; the Gram-Schmidt variants differ, see
// kernels/lowrank_cuda.h):
//   gemm: the host's bits for k == 0 and k == 1 (an outer product: kernels/lowrank_ops.cuh's element function on
//         both sides); otherwise |gpu - cpu| <= 8 sqrt(k) FLT_EPSILON (|alpha| |row i of op(A)|_2 |column j of op(B)|_2 + |beta C_ij|)
//         per element, about 1e-6 sqrt(k) relative to the inputs' norms (float rounding of a k-term dot product is
//         bounded by k FLT_EPSILON of that norm product; random signs make it ~ FLT_EPSILON);
//   orthonormalize_rows: |gpu row - cpu row|_2 <= 1e-5 sqrt(rows) (rows have unit norm; the inputs are random, so
//         well conditioned), and the GPU's rows orthonormal within 1e-5.
// Without a CUDA device the executable reports SKIPPED (exit 77).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compressors/lowrank_ops.h"
#include "gradcomp/error.h"
#include "gradcomp/tensor.h"
#include "kernels/half_ops.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;

// Element counts: shorter than a warp, one block, a prime, and one that makes every grid-stride loop run at least
// twice per thread on an H200 (tests/gpu/parity_data.h: kGridStrideSize).
const std::vector<std::size_t> kSizes = {1, 7, 4096, 100003, 4'500'007};

// Deterministic, fast values in [-1, 1) (splitmix64).
std::vector<float> uniform_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> values(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : values) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
  return values;
}

float from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
std::uint32_t to_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Values with every special an operation may meet: NaN (quiet, negative with a payload), +-inf, -0, subnormals,
// values near f16's overflow and large ones.
std::vector<float> special_values(std::size_t n, std::uint64_t seed) {
  auto values = uniform_values(n, seed);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            from_bits(0xFFC01234u),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            0.0f,
                            1e-40f,
                            -3e-39f,
                            65519.0f,
                            -65520.0f,
                            3e38f,
                            1e5f};
  std::size_t s = 0;
  for (std::size_t i = seed % 7; i < n; i += 1013) values[i] = specials[s++ % std::size(specials)];
  return values;
}

bool is_nan_bits(std::uint16_t bits, DType dtype) {
  return dtype == DType::kF16 ? ((bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu) != 0)
                              : ((bits & 0x7F80u) == 0x7F80u && (bits & 0x007Fu) != 0);
}

// Bit-equal, or (when nan_is_nan) both NaN.
::testing::AssertionResult same_floats(const std::vector<float>& gpu, const std::vector<float>& cpu, bool nan_is_nan) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes " << gpu.size() << " vs " << cpu.size();
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (to_bits(gpu[i]) == to_bits(cpu[i])) continue;
    if (nan_is_nan && std::isnan(gpu[i]) && std::isnan(cpu[i])) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << gpu.size() << ": gpu " << gpu[i] << " (0x"
                                         << std::hex << to_bits(gpu[i]) << ") vs cpu " << cpu[i] << " (0x"
                                         << to_bits(cpu[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_halves(const std::vector<std::uint16_t>& gpu, const std::vector<std::uint16_t>& cpu,
                                       DType dtype, bool nan_is_nan) {
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] == cpu[i]) continue;
    if (nan_is_nan && is_nan_bits(gpu[i], dtype) && is_nan_bits(cpu[i], dtype)) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << gpu.size() << ": gpu 0x" << std::hex << gpu[i]
                                         << " vs cpu 0x" << cpu[i];
  }
  return ::testing::AssertionSuccess();
}

class LowRankOpsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    gpu_ = cuda_lowrank_ops(view_on_gpu(nullptr, 0, DType::kF32));
    cpu_ = host_lowrank_ops(1);
  }
  void TearDown() override {
    gpu_.reset();
    cudaStreamDestroy(stream_);
  }

  // After a DeviceArray's cudaMemcpy from pageable memory: that copy's DMA may still run when cudaMemcpy returns,
  // and work on a non-blocking stream does not wait for the legacy default stream.
  static void settle() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

  TensorView view_on_gpu(void* data, std::size_t n, DType dtype) const {
    return TensorView(data, n, dtype, Device::cuda(0), stream_);
  }
  FloatBuffer to_gpu(const std::vector<float>& host) {
    FloatBuffer buffer = gpu_->allocate(host.size());
    gpu_->upload(buffer.data(), host.data(), host.size());
    return buffer;
  }
  std::vector<float> to_host(const float* device, std::size_t n) {
    std::vector<float> host(n);
    gpu_->download(host.data(), device, n);
    return host;
  }
  std::vector<float> to_host(const FloatBuffer& buffer) { return to_host(buffer.data(), buffer.size()); }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LowRankOps> gpu_, cpu_;
};

TEST_F(LowRankOpsGpu, DeviceAllocateUploadDownload) {
  EXPECT_EQ(gpu_->device(), 0);
  EXPECT_TRUE(gpu_->allocate(0).empty());
  EXPECT_EQ(gpu_->allocate(5).size(), 5u);
  const auto values = special_values(100003, 1);
  const FloatBuffer buffer = to_gpu(values);
  EXPECT_TRUE(same_floats(to_host(buffer), values, false));
  // Page-locked host memory: upload returns when the caller may reuse it.
  void* pinned_bytes = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned_bytes, values.size() * sizeof(float)), cudaSuccess);
  auto* pinned = static_cast<float*>(pinned_bytes);
  std::memcpy(pinned, values.data(), values.size() * sizeof(float));
  const FloatBuffer other = gpu_->allocate(values.size());
  gpu_->upload(other.data(), pinned, values.size());
  std::memset(pinned, 0, values.size() * sizeof(float));
  EXPECT_TRUE(same_floats(to_host(other), values, false));
  cudaFreeHost(pinned);

  std::vector<float> host(4);
  EXPECT_THROW(cuda_lowrank_ops(TensorView::of(std::span<float>(host))), InvalidArgument);
}

TEST_F(LowRankOpsGpu, CopyFillZeroAddScale) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto x = special_values(n, 2);
    const auto y = special_values(n, 3);
    const FloatBuffer gx = to_gpu(x);

    FloatBuffer gy = gpu_->allocate(n);
    gpu_->copy(gy.data(), gx.data(), n);
    EXPECT_TRUE(same_floats(to_host(gy), x, false)) << "copy";

    gpu_->fill_zero(gy.data(), n);
    std::vector<float> cy = y;
    cpu_->fill_zero(cy.data(), n);
    EXPECT_TRUE(same_floats(to_host(gy), cy, false)) << "fill_zero";

    gy = to_gpu(y);
    cy = y;
    gpu_->add(gy.data(), gx.data(), n);
    cpu_->add(cy.data(), x.data(), n);
    EXPECT_TRUE(same_floats(to_host(gy), cy, true)) << "add";

    for (const float s : {1.0f, 0.37f, -2.5f, 0.0f}) {
      gy = to_gpu(y);
      cy = y;
      gpu_->scale(gy.data(), n, s);
      cpu_->scale(cy.data(), n, s);
      EXPECT_TRUE(same_floats(to_host(gy), cy, s != 1.0f)) << "scale by " << s;
    }
  }
}

// f16/bf16 bits of `values` (rounded by the shared conversions), with NaN/inf/subnormal half values mixed in.
std::vector<std::uint16_t> half_values(std::size_t n, DType dtype, std::uint64_t seed) {
  const auto values = special_values(n, seed);
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) {
    bits[i] = dtype == DType::kF16 ? kernels::float_to_half_bits(values[i]) : kernels::float_to_bf16_bits(values[i]);
  }
  for (std::size_t i = 3; i < n; i += 2003) bits[i] = 0x0001u;  // the smallest subnormal
  for (std::size_t i = 11; i < n; i += 3001) bits[i] = dtype == DType::kF16 ? 0xFE01u : 0xFF81u;  // NaN, payload
  return bits;
}

TEST_F(LowRankOpsGpu, LoadAndStoreEveryDtype) {
  struct StoreCase {
    float s;
    bool accumulate;
  };
  const StoreCase stores[] = {{1.0f, false}, {1.0f, true}, {0.37f, false}, {-1.5f, true}, {1024.0f, true}};
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const std::size_t n : kSizes) {
      for (const std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " n = " + std::to_string(n) +
                     " offset = " + std::to_string(offset));
        const std::size_t total = offset + n + 5;
        const auto values = special_values(n, 4 + n);
        const FloatBuffer gvalues = to_gpu(values);
        if (dtype == DType::kF32) {
          const auto tensor = special_values(total, 5);
          DeviceArray<float> device(tensor);
          settle();
          // load
          const FloatBuffer gout = gpu_->allocate(n);
          std::vector<float> cout(n);
          gpu_->load_f32(view_on_gpu(device.data(), total, dtype), offset, n, gout.data());
          cpu_->load_f32(TensorView(const_cast<float*>(tensor.data()), total, dtype), offset, n, cout.data());
          EXPECT_TRUE(same_floats(to_host(gout), cout, false)) << "load_f32";
          // store
          for (const auto& store : stores) {
            device.upload(tensor);
            settle();
            std::vector<float> expected = tensor;
            gpu_->store_f32(gvalues.data(), store.s, view_on_gpu(device.data(), total, dtype), offset, n,
                            store.accumulate);
            cpu_->store_f32(values.data(), store.s, TensorView(expected.data(), total, dtype), offset, n,
                            store.accumulate);
            gpu_->synchronize();
            const bool copy = store.s == 1.0f && !store.accumulate;
            EXPECT_TRUE(same_floats(device.download(), expected, !copy))
                << "store_f32 s = " << store.s << " accumulate = " << store.accumulate;
          }
        } else {
          const auto tensor = half_values(total, dtype, 6);
          DeviceArray<std::uint16_t> device(tensor);
          settle();
          const FloatBuffer gout = gpu_->allocate(n);
          std::vector<float> cout(n);
          gpu_->load_f32(view_on_gpu(device.data(), total, dtype), offset, n, gout.data());
          cpu_->load_f32(TensorView(const_cast<std::uint16_t*>(tensor.data()), total, dtype), offset, n, cout.data());
          EXPECT_TRUE(same_floats(to_host(gout), cout, false)) << "load_f32";
          for (const auto& store : stores) {
            device.upload(tensor);
            settle();
            std::vector<std::uint16_t> expected = tensor;
            gpu_->store_f32(gvalues.data(), store.s, view_on_gpu(device.data(), total, dtype), offset, n,
                            store.accumulate);
            cpu_->store_f32(values.data(), store.s, TensorView(expected.data(), total, dtype), offset, n,
                            store.accumulate);
            gpu_->synchronize();
            EXPECT_TRUE(same_halves(device.download(), expected, dtype, true))
                << "store_f32 s = " << store.s << " accumulate = " << store.accumulate;
          }
        }
      }
    }
  }
  // A range past the tensor's end, or a tensor of another dtype, is refused.
  DeviceArray<float> device(std::size_t{8});
  const FloatBuffer out = gpu_->allocate(8);
  EXPECT_THROW(gpu_->load_f32(view_on_gpu(device.data(), 8, DType::kF32), 4, 5, out.data()), InvalidArgument);
  EXPECT_THROW(gpu_->store_f32(out.data(), 1.0f, view_on_gpu(device.data(), 8, DType::kF32), 9, 0, false),
               InvalidArgument);
  EXPECT_THROW(gpu_->load_f32(view_on_gpu(device.data(), 8, DType::kI32), 0, 8, out.data()), InvalidArgument);
}

TEST_F(LowRankOpsGpu, FillRandomGivesTheHostsValues) {
  struct Key {
    std::uint64_t seed, key, step;
  };
  const Key keys[] = {{0, 0, 0}, {42, 0x0123456789ABCDEFull, 7}, {~0ull, 1, 0xFFFFFFFF00000001ull}};
  for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{5}, std::size_t{1001},
                              std::size_t{4'500'007}}) {
    for (const auto& k : keys) {
      SCOPED_TRACE("n = " + std::to_string(n) + " seed = " + std::to_string(k.seed));
      const FloatBuffer g = gpu_->allocate(n);
      std::vector<float> c(n);
      gpu_->fill_random(g.data(), n, k.seed, k.key, k.step);
      cpu_->fill_random(c.data(), n, k.seed, k.key, k.step);
      EXPECT_TRUE(same_floats(to_host(g), c, false));
    }
  }
}

TEST_F(LowRankOpsGpu, NonfiniteCountFirstAndZero) {
  for (const std::size_t n : kSizes) {
    // None; only the last; the specials (NaN and inf every 1013th from seed % 7 on); all.
    std::vector<std::vector<float>> cases = {uniform_values(n, 7), uniform_values(n, 8), special_values(n, 9),
                                             std::vector<float>(n, std::numeric_limits<float>::infinity())};
    cases[1][n - 1] = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE("n = " + std::to_string(n) + " case " + std::to_string(c));
      const auto& values = cases[c];
      FloatBuffer g = to_gpu(values);
      std::size_t gpu_first = 12345, cpu_first = 54321;
      const std::size_t gpu_count = gpu_->count_nonfinite(g.data(), n, gpu_first);
      const std::size_t cpu_count = cpu_->count_nonfinite(values.data(), n, cpu_first);
      EXPECT_EQ(gpu_count, cpu_count);
      EXPECT_EQ(gpu_first, cpu_first);
      std::vector<float> zeroed = values;
      gpu_->zero_nonfinite(g.data(), n);
      cpu_->zero_nonfinite(zeroed.data(), n);
      EXPECT_TRUE(same_floats(to_host(g), zeroed, false));
    }
  }
  std::size_t first = 99;
  EXPECT_EQ(gpu_->count_nonfinite(nullptr, 0, first), 0u);
  EXPECT_EQ(first, 0u);
}

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
TEST_F(LowRankOpsGpu, ThreadsAndStreamsDoNotShareScratch) {
  const std::size_t rows = 16, cols = 100003;
  const auto v = uniform_values(rows * cols, 14);
  const auto m = uniform_values(cols * 64, 15);
  // The lone run: V orthonormalized, then W = V M (16 x 64), and the NaN count of V with one NaN.
  const auto lone = [&](cudaStream_t stream, std::vector<float>& ortho, std::vector<float>& product,
                        std::size_t& count) {
    auto ops = cuda_lowrank_ops(TensorView(nullptr, 0, DType::kF32, Device::cuda(0), stream));
    FloatBuffer gv = ops->allocate(v.size()), gm = ops->allocate(m.size()), gw = ops->allocate(rows * 64);
    ops->upload(gv.data(), v.data(), v.size());
    ops->upload(gm.data(), m.data(), m.size());
    for (int repeat = 0; repeat < 3; ++repeat) {
      ops->upload(gv.data(), v.data(), v.size());
      ops->orthonormalize_rows(gv.data(), rows, cols, 0.0f);
      ops->gemm(false, false, rows, 64, cols, 1.0f, gv.data(), cols, gm.data(), 64, 0.0f, gw.data(), 64);
    }
    ortho.resize(v.size());
    product.resize(rows * 64);
    ops->download(ortho.data(), gv.data(), v.size());
    ops->download(product.data(), gw.data(), product.size());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    ops->upload(gv.data() + 777, &nan, 1);
    std::size_t first = 0;
    count = ops->count_nonfinite(gv.data(), v.size(), first);
    EXPECT_EQ(first, 777u);
  };
  std::vector<float> ortho, product;
  std::size_t count = 0;
  lone(stream_, ortho, product, count);
  EXPECT_EQ(count, 1u);

  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> ortho_a, product_a, ortho_b, product_b, ortho_c, product_c;
  std::size_t count_a = 0, count_b = 0, count_c = 0;
  std::thread a([&] { lone(stream_, ortho_a, product_a, count_a); });
  std::thread b([&] { lone(other, ortho_b, product_b, count_b); });
  std::thread c([&] { lone(nullptr, ortho_c, product_c, count_c); });
  a.join();
  b.join();
  c.join();
  cudaStreamDestroy(other);
  EXPECT_TRUE(same_floats(ortho_a, ortho, false));
  EXPECT_TRUE(same_floats(ortho_b, ortho, false));
  EXPECT_TRUE(same_floats(ortho_c, ortho, false));
  EXPECT_TRUE(same_floats(product_a, product, false));
  EXPECT_TRUE(same_floats(product_b, product, false));
  EXPECT_TRUE(same_floats(product_c, product, false));
  EXPECT_EQ(count_a, 1u);
  EXPECT_EQ(count_b, 1u);
  EXPECT_EQ(count_c, 1u);
}

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
