// LowRankOps on one CUDA device (compressors/codecs/lowrank_ops.h): kernels from kernels/lowrank_cuda.h and
// kernels/common_cuda.h, and cuBLAS's sgemm (but for k == 1, an outer-product kernel), all enqueued on the stream of
// the tensor the ops were made for. Only
// download(), count_nonfinite() and synchronize() wait for the device (and upload() from page-locked host memory,
// so that the caller may reuse its buffer on return, as with the host ops).
//
// Per host thread and device: one cuBLAS handle (cublasSetStream on a handle shared between threads would race).
// Per host thread, device and stream: one scratch block (cuBLAS's workspace, Gram-Schmidt's partial sums, the
// NaN/Inf result), allocated on first use and kept until the thread exits, so no call allocates in steady state
// and two streams never share a workspace (cuBLAS's own default workspace is shared by every stream of a handle).
#include "gradcomp/config.h"

#include "compressors/codecs/lowrank_ops.h"
#include "gradcomp/error.h"

#if GRADCOMP_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/common_cuda.h"
#include "kernels/cuda_buffer.h"
#include "compressors/cuda/lowrank_cuda_resources.h"
#include "kernels/cuda_check.h"
#include "kernels/lowrank_cuda.h"
#include "kernels/usage_counters.h"
#endif

namespace gradcomp {

#if GRADCOMP_WITH_CUDA
namespace {

using lowrank_cuda::QuietDeviceSwitch;
using lowrank_cuda::ScratchLayout;
using lowrank_cuda::thread_resources;
using lowrank_cuda::ThreadResources;
using lowrank_cuda::kCublasWorkspaceBytes;

// FloatBuffer's release: cudaFree with the block's own device current (the buffer may die on another device's turn).
void release_device_floats(float* data, int device) {
  // A failure here must not surface as the next launch's error: clear what it set, and only that.
  const QuietDeviceSwitch on(device);
  if (cudaFree(data) != cudaSuccess) (void)cudaGetLastError();
}

int blas_int(std::size_t value, const char* what) {
  GRADCOMP_CHECK(value <= static_cast<std::size_t>(INT_MAX),
                 "cuda_lowrank_ops: gemm {} {} exceeds cuBLAS's 32-bit index range", what, value);
  return static_cast<int>(value);
}

class CudaLowRankOps final : public LowRankOps {
 public:
  explicit CudaLowRankOps(const TensorView& tensor)
      : device_(tensor.device().index), stream_(static_cast<cudaStream_t>(tensor.stream())) {}

  int device() const override { return device_; }

  FloatBuffer allocate(std::size_t n) override {
    if (n == 0) return {};
    const kernels::DeviceGuard guard(device_);
    void* data = nullptr;
    GRADCOMP_CUDA_CHECK(cudaMalloc(&data, n * sizeof(float)));
    return FloatBuffer(static_cast<float*>(data), n, device_, &release_device_floats);
  }

  void copy(float* dst, const float* src, std::size_t n) override {
    if (n == 0 || dst == src) return;
    const kernels::DeviceGuard guard(device_);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }

  void fill_zero(float* dst, std::size_t n) override {
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), stream_));
  }

  void upload(float* dst, const float* host, std::size_t n) override {
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    // The caller may reuse `host` as soon as upload returns, and from page-locked memory the copy is truly
    // asynchronous: wait for it (uploads are rare: a state load, a tensor moving between devices).
    kernels::synchronize_stream(stream_);
  }

  void download(float* host, const float* src, std::size_t n) override {
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    kernels::synchronize_stream(stream_);
  }

  void load_f32(const TensorView& in, std::size_t offset, std::size_t n, float* out) override {
    check_view(in, offset, n, "load_f32 from");
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    const auto* base = static_cast<const std::byte*>(in.data()) + offset * dtype_size(in.dtype());
    if (in.dtype() == DType::kF32) {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(out, base, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    } else {
      kernels::launch_half_to_float(reinterpret_cast<const std::uint16_t*>(base), out, n,
                                    in.dtype() == DType::kBF16, stream_);
    }
  }

  void store_f32(const float* values, float s, const TensorView& out, std::size_t offset, std::size_t n,
                 bool accumulate) override {
    check_view(out, offset, n, "store_f32 into");
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    auto* base = static_cast<std::byte*>(out.data()) + offset * dtype_size(out.dtype());
    if (out.dtype() == DType::kF32 && !accumulate && s == 1.0f) {  // a copy, as on the host (NaN payloads included)
      if (reinterpret_cast<const float*>(base) != values) {
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(base, values, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
      }
      return;
    }
    const auto dtype = out.dtype() == DType::kF32   ? kernels::LowRankDType::kF32
                       : out.dtype() == DType::kF16 ? kernels::LowRankDType::kF16
                                                    : kernels::LowRankDType::kBF16;
    kernels::launch_lowrank_store(values, s, base, dtype, n, accumulate, stream_);
  }

  void add(float* y, const float* x, std::size_t n) override {
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    kernels::launch_lowrank_add(y, x, n, stream_);
  }

  void scale(float* x, std::size_t n, float s) override {
    if (n == 0 || s == 1.0f) return;  // as on the host: scaling by 1 leaves every bit alone
    const kernels::DeviceGuard guard(device_);
    kernels::launch_lowrank_scale(x, n, s, stream_);
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS sees each row-major matrix as its
  // transpose, so B goes first, and each operand keeps its own transpose flag.
  void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
            std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) override {
    if (m == 0 || n == 0) return;
    GRADCOMP_CHECK(ldc >= n, "cuda_lowrank_ops: gemm ldc {} < n {}", ldc, n);
    const kernels::DeviceGuard guard(device_);
    if (k == 0) {  // C = beta C, beta = 0 ignoring C's old contents (as the host ops do)
      kernels::launch_lowrank_scale_matrix(c, m, n, ldc, beta, stream_);
      return;
    }
    const std::size_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    GRADCOMP_CHECK(lda >= a_cols, "cuda_lowrank_ops: gemm lda {} < {} (the columns of {}A)", lda, a_cols,
                   trans_a ? "transposed " : "");
    GRADCOMP_CHECK(ldb >= b_cols, "cuda_lowrank_ops: gemm ldb {} < {} (the columns of {}B)", ldb, b_cols,
                   trans_b ? "transposed " : "");
    if (k == 1) {  // an outer product: the host's element function, so the host's bits (kernels/lowrank_ops.cuh)
      kernels::launch_lowrank_outer(c, m, n, ldc, alpha, a, trans_a ? 1 : lda, b, trans_b ? ldb : 1, beta, stream_);
      return;
    }
    const int im = blas_int(m, "rows"), in = blas_int(n, "columns"), ik = blas_int(k, "inner dimension");
    const int ilda = blas_int(lda, "leading dimension"), ildb = blas_int(ldb, "leading dimension"),
              ildc = blas_int(ldc, "leading dimension");
    ThreadResources& resources = thread_resources();
    cublasHandle_t handle = resources.handle(device_);
    std::byte* scratch = resources.scratch(device_, stream_);
    GRADCOMP_CUBLAS_CHECK(cublasSetStream(handle, stream_));
    // After cublasSetStream (which resets it): this stream's own workspace.
    GRADCOMP_CUBLAS_CHECK(cublasSetWorkspace(handle, scratch, kCublasWorkspaceBytes));
    GRADCOMP_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      in, im, ik, &alpha, b, ildb, a, ilda, &beta, c, ildc));
  }

  void orthonormalize_rows(float* v, std::size_t rows, std::size_t cols, float eps) override {
    if (rows == 0 || cols == 0) return;
    const kernels::DeviceGuard guard(device_);
    std::byte* scratch = thread_resources().scratch(device_, stream_);
    kernels::launch_orthonormalize_rows(v, rows, cols, eps, scratch + ScratchLayout().ortho_offset, stream_);
  }

  std::size_t count_nonfinite(const float* x, std::size_t n, std::size_t& first) override {
    first = n;
    if (n == 0) return 0;
    const kernels::DeviceGuard guard(device_);
    auto* result = reinterpret_cast<unsigned long long*>(thread_resources().scratch(device_, stream_) +
                                                         ScratchLayout().nonfinite_offset);
    kernels::launch_find_nonfinite(x, n, result, stream_);
    unsigned long long host[2] = {0, 0};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host, result, sizeof(host), cudaMemcpyDeviceToHost, stream_));
    kernels::synchronize_stream(stream_);
    if (host[0] != 0) first = static_cast<std::size_t>(host[1]);
    return static_cast<std::size_t>(host[0]);
  }

  void begin_counts(std::size_t slots) override {
    slots_ = slots;
    if (slots == 0) return;
    const kernels::DeviceGuard guard(device_);
    counts_device_ = thread_resources().counts(device_, stream_, slots);
    // A slot never filled reads as zero (launch_find_nonfinite initializes the ones it fills).
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(counts_device_, 0, slots * kernels::kNonfiniteResultBytes, stream_));
  }

  void count_nonfinite_into(const float* x, std::size_t n, std::size_t slot) override {
    GRADCOMP_ASSERT(slot < slots_, "cuda_lowrank_ops: count slot {} of {}", slot, slots_);
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    kernels::launch_find_nonfinite(x, n, counts_device_ + 2 * slot, stream_);
  }

  std::vector<NonfiniteCount> read_counts() override {
    std::vector<NonfiniteCount> out(slots_);
    if (slots_ == 0) return out;
    const kernels::DeviceGuard guard(device_);
    std::vector<unsigned long long> host(2 * slots_);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), counts_device_, slots_ * kernels::kNonfiniteResultBytes,
                                        cudaMemcpyDeviceToHost, stream_));
    kernels::synchronize_stream(stream_);
    for (std::size_t s = 0; s < slots_; ++s) {
      out[s].count = static_cast<std::size_t>(host[2 * s]);
      out[s].first = host[2 * s] != 0 ? static_cast<std::size_t>(host[2 * s + 1]) : 0;
    }
    return out;
  }

  void project_into(const float* g, const float* r, float* m, const float* q, std::size_t rank, std::size_t rows,
                    std::size_t cols, float* p, std::size_t slot) override {
    const std::size_t n = rows * cols;
    count_nonfinite_into(g, n, slot);
    if (m != g) copy(m, g, n);
    if (r != nullptr) add(m, r, n);
    gemm(false, true, rank, rows, cols, 1.0f, q, cols, m, cols, 0.0f, p, rows);
  }

  void zero_nonfinite(float* x, std::size_t n) override {
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    kernels::launch_zero_nonfinite(x, n, stream_);
  }

  void fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step) override {
    if (n == 0) return;
    const kernels::DeviceGuard guard(device_);
    kernels::launch_lowrank_fill_random(x, n, seed, key, step, stream_);
  }

  void synchronize() override {
    const kernels::DeviceGuard guard(device_);
    kernels::synchronize_stream(stream_);
  }

 private:
  // `view` must be an f32/f16/bf16 tensor on this device holding [offset, offset + n).
  void check_view(const TensorView& view, std::size_t offset, std::size_t n, const char* what) const {
    GRADCOMP_CHECK(view.device() == Device::cuda(device_), "cuda_lowrank_ops: {} {}: not on cuda:{}", what,
                   view.describe(), device_);
    GRADCOMP_CHECK(view.dtype() == DType::kF32 || view.dtype() == DType::kF16 || view.dtype() == DType::kBF16,
                   "cuda_lowrank_ops: {} {}: only f32, f16 and bf16 tensors", what, view.describe());
    GRADCOMP_CHECK(offset <= view.numel() && n <= view.numel() - offset,
                   "cuda_lowrank_ops: {} {}: elements [{}, {}) out of range", what, view.describe(), offset,
                   offset + n);
  }

  int device_;
  cudaStream_t stream_;
  unsigned long long* counts_device_ = nullptr;  // begin_counts' slots
  std::size_t slots_ = 0;
};

}  // namespace

std::unique_ptr<LowRankOps> cuda_lowrank_ops(const TensorView& tensor) {
  GRADCOMP_CHECK(tensor.device().is_cuda(), "cuda_lowrank_ops: {} is not a CUDA tensor", tensor.describe());
  return std::make_unique<CudaLowRankOps>(tensor);
}
#undef GRADCOMP_CUBLAS_CHECK
#else
std::unique_ptr<LowRankOps> cuda_lowrank_ops(const TensorView& tensor) {
  throw InvalidArgument(fmt::format(
      "cuda_lowrank_ops({}): the CUDA low-rank kernels need a CUDA build (gradcomp was built without CUDA)",
      tensor.describe()));
}
#endif

}  // namespace gradcomp
