// The CUDA LowRankOps (compressors/cuda/lowrank_ops_cuda.cc) against the host ones (host_lowrank_ops(1)), operation by
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
#include "tests/gpu/lowrank_gpu_fixture.h"

namespace gradcomp {
namespace {

using namespace lowrank_test;  // NOLINT: the shared test data and fixture

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