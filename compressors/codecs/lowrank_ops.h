// The kernels of one PowerSGD step, in one memory space: host memory (loops and BLAS) or one CUDA device (kernels
// and cuBLAS, ordered on one stream). compressors/codecs/powersgd_step.cc writes the step once against this interface; the
// CPU tests run the very code the device path runs, only these operations differ. The element math of both spaces is
// kernels/lowrank_ops.cuh's.
//
// Matrices are row-major. Every pointer is memory of this space unless said otherwise.
//
// Ordering: the CUDA ops only enqueue work on their stream (the tensor's), except where a function below says it
// waits. Work is ordered within one ops object's stream; memory written there and read through another stream
// (another ops object, the legacy default stream, the host) needs synchronize() first. compressed_allreduce does
// that for the codec: it synchronizes the tensor's stream before it returns (powersgd_codec.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gradcomp/tensor.h"

namespace gradcomp {

// An owned, uninitialized array of floats in one space (host, device -1, or one CUDA device), released by
// `release(data, device)`: the buffer knows where it lives, so nothing asks the driver. Move-only.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(float* data, std::size_t size, int device, void (*release)(float*, int))
      : data_(data), size_(size), device_(device), release_(release) {}
  FloatBuffer(FloatBuffer&& other) noexcept { swap(other); }
  FloatBuffer& operator=(FloatBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      swap(other);
    }
    return *this;
  }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { reset(); }

  float* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void reset() {
    if (data_ && release_) release_(data_, device_);
    data_ = nullptr;
    size_ = 0;
  }
  void swap(FloatBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(device_, other.device_);
    std::swap(release_, other.release_);
  }
  float* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
  void (*release_)(float*, int) = nullptr;
};

class LowRankOps {
 public:
  virtual ~LowRankOps() = default;

  // -1 for host memory, else the CUDA device ordinal.
  virtual int device() const = 0;
  // `n` floats in this space, uninitialized (n may be 0).
  virtual FloatBuffer allocate(std::size_t n) = 0;
  // dst[i] = src[i], both in this space.
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  // dst[i] = 0.
  virtual void fill_zero(float* dst, std::size_t n) = 0;
  // Host -> this space. Returns when `host` may be reused or freed (the CUDA ops wait for the copy: `host` may be
  // page-locked, whose copy is truly asynchronous); later work of this space is ordered after it.
  virtual void upload(float* dst, const float* host, std::size_t n) = 0;
  // This space -> host. Waits for the work queued before it; returns when the values are in `host`.
  virtual void download(float* host, const float* src, std::size_t n) = 0;

  // out[i] = float(in[offset + i]) for i < n; `in` is f32, f16 or bf16 in this space.
  virtual void load_f32(const TensorView& in, std::size_t offset, std::size_t n, float* out) = 0;
  // out[offset + i] (=, or += when accumulate) scale * values[i], rounded to out's dtype (f32, f16 or bf16).
  virtual void store_f32(const float* values, float scale, const TensorView& out, std::size_t offset, std::size_t n,
                         bool accumulate) = 0;
  // y[i] += x[i].
  virtual void add(float* y, const float* x, std::size_t n) = 0;
  // x[i] *= s.
  virtual void scale(float* x, std::size_t n, float s) = 0;

  // C (m x n, leading dimension ldc) = alpha * op(A) * op(B) + beta * C, where op(A) is m x k (A, or A transposed
  // when trans_a: then A is k x m) and op(B) is k x n. beta = 0 ignores C's old contents (NaN included).
  virtual void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                    const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                    std::size_t ldc) = 0;
  // Gram-Schmidt over the `rows` rows (each `cols` long, contiguous) of v, in order: row j minus its projections on
  // the rows before it, then divided by (its norm + eps). A row whose norm + eps is 0 is left all zero.
  virtual void orthonormalize_rows(float* v, std::size_t rows, std::size_t cols, float eps) = 0;

  // Count of NaN/Inf values among x[0, n); `first` receives the smallest such index (n when none).
  // Waits for the result (a CUDA stream synchronization).
  virtual std::size_t count_nonfinite(const float* x, std::size_t n, std::size_t& first) = 0;
  // x[i] = 0 where x[i] is NaN or Inf.
  virtual void zero_nonfinite(float* x, std::size_t n) = 0;
  // x[i] = kernels::lowrank_random(bits(i)) of the Philox stream (seed, key, step): uniform in [-0.5, 0.5), the
  // same values on host and device.
  virtual void fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step) = 0;

  // Waits until everything queued on this ops object's stream is done (before a communicator, the host or another
  // stream reads its buffers). Nothing to wait for on the host.
  virtual void synchronize() = 0;

  // Non-finite counts of several arrays with one wait (a CUDA stream synchronization) however many there are:
  // begin_counts(slots) opens `slots` empty slots, count_nonfinite_into() and project_into() fill one without
  // waiting, read_counts() returns every slot's count and first index (as count_nonfinite). The defaults count at
  // once (the host, which has nothing to wait for); the CUDA ops enqueue the counts and read them back together.
  struct NonfiniteCount {
    std::size_t count = 0;
    std::size_t first = 0;
  };
  virtual void begin_counts(std::size_t slots);
  virtual void count_nonfinite_into(const float* x, std::size_t n, std::size_t slot);
  virtual std::vector<NonfiniteCount> read_counts();

  // PowerSGD's two passes over a rows x cols matrix, as one pass each where the space can fuse them (the host does;
  // the defaults compose the operations above, which is what the CUDA ops use).
  //
  // project: counts the NaN/Inf of g (returned; `first` as count_nonfinite), writes m = g + r (r null: m = g; m may
  // alias g), and p (rank x rows) = q (rank x cols) * m^T. Waits for the count.
  virtual std::size_t project(const float* g, const float* r, float* m, const float* q, std::size_t rank,
                              std::size_t rows, std::size_t cols, float* p, std::size_t& first);
  // project() whose count goes into slot `slot` (begin_counts) instead of being waited for.
  virtual void project_into(const float* g, const float* r, float* m, const float* q, std::size_t rank,
                            std::size_t rows, std::size_t cols, float* p, std::size_t slot);
  // reconstruct: with s = p^T q (rows x cols; p rank x rows, q rank x cols): residual = m - s when residual is not
  // null, then out = alpha * s when out is not null (out may alias m: each element of m is read before out's).
  virtual void reconstruct(const float* m, const float* p, const float* q, std::size_t rank, std::size_t rows,
                           std::size_t cols, float* residual, float* out, float alpha);

 protected:
  std::vector<NonfiniteCount> counts_;  // the default slots (begin_counts)
};

// Host memory: loops and BLAS (cblas_sgemm). `threads` bounds the loops' worker threads (0 = all).
std::unique_ptr<LowRankOps> host_lowrank_ops(int threads);
// The CUDA device and stream of `tensor` (CUDA builds; throws InvalidArgument otherwise).
std::unique_ptr<LowRankOps> cuda_lowrank_ops(const TensorView& tensor);

}  // namespace gradcomp
