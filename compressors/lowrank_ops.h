// The kernels of one PowerSGD step, in one memory space: host memory (loops and BLAS) or one CUDA device (kernels
// and cuBLAS, ordered on one stream). compressors/powersgd.cc writes the step once against this interface; the CPU
// tests run the very code the device path runs, only these operations differ.
//
// Matrices are row-major. Every pointer is memory of this space unless said otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gradcomp/tensor.h"

namespace gradcomp {

// An owned, uninitialized array of floats in one space (host or one CUDA device). Move-only.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(float* data, std::size_t size, void (*release)(float*)) : data_(data), size_(size), release_(release) {}
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
    if (data_ && release_) release_(data_);
    data_ = nullptr;
    size_ = 0;
  }
  void swap(FloatBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(release_, other.release_);
  }
  float* data_ = nullptr;
  std::size_t size_ = 0;
  void (*release_)(float*) = nullptr;
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
  // Host -> this space, and this space -> host (returns when the values are in `host`).
  virtual void upload(float* dst, const float* host, std::size_t n) = 0;
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
  virtual std::size_t count_nonfinite(const float* x, std::size_t n, std::size_t& first) = 0;
  // x[i] = 0 where x[i] is NaN or Inf.
  virtual void zero_nonfinite(float* x, std::size_t n) = 0;
  // x[i] = uniform01(bits(i)) - 0.5 of the Philox stream (seed, key, step): the same values on host and device.
  virtual void fill_random(float* x, std::size_t n, std::uint64_t seed, std::uint64_t key, std::uint64_t step) = 0;

  // Waits until everything queued in this space is done (before a communicator or the host reads its buffers).
  virtual void synchronize() = 0;
};

// Host memory: loops and BLAS (cblas_sgemm). `threads` bounds the loops' worker threads (0 = all).
std::unique_ptr<LowRankOps> host_lowrank_ops(int threads);
// The CUDA device and stream of `tensor` (CUDA builds; throws InvalidArgument otherwise).
std::unique_ptr<LowRankOps> cuda_lowrank_ops(const TensorView& tensor);

}  // namespace gradcomp
