// Where a compressed collective keeps its working memory (payloads, gathered payloads, f32 sums) and the few
// operations that touch it. The algorithms (dense, allgather, sparse, scatter-reduce-allgather, hierarchical) are
// written once against this interface: on the host for CPU tensors (and for device tensors staged through a
// communicator that cannot take device memory), or on the tensor's CUDA device, ordered on the tensor's stream, when
// the communicator can (NCCL). The CPU tests run the very code the device path runs; only these operations differ.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/algorithms/buffer_pool.h"
#include "gradcomp/tensor.h"

namespace gradcomp::algorithms {

// A byte buffer that is not zero-filled on allocation (payload buffers are large and written by the codec). Host
// blocks come from and return to the per-thread pool of buffer_pool.h; device blocks are owned through `release`.
class Bytes {
 public:
  explicit Bytes(std::size_t capacity) : block_(acquire_block(capacity)), size_(capacity) {}
  // Device (or other foreign) memory: `release(data)` is called once when the buffer goes away.
  Bytes(std::byte* data, std::size_t size, void (*release)(std::byte*, std::size_t))
      : foreign_(data), release_(release), foreign_capacity_(size), size_(size) {}
  Bytes(Bytes&& other) noexcept { *this = std::move(other); }
  Bytes& operator=(Bytes&& other) noexcept {
    if (this != &other) {
      reset();
      block_ = std::move(other.block_);
      foreign_ = other.foreign_;
      release_ = other.release_;
      foreign_capacity_ = other.foreign_capacity_;
      size_ = other.size_;
      other.foreign_ = nullptr;
      other.release_ = nullptr;
    }
    return *this;
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  ~Bytes() { reset(); }
  std::byte* data() const { return foreign_ ? foreign_ : block_.data.get(); }
  std::size_t size() const { return size_; }
  void shrink(std::size_t size) { size_ = size; }
  std::byte* begin() const { return data(); }
  std::byte* end() const { return data() + size_; }
  operator std::span<const std::byte>() const { return {data(), size_}; }
  operator std::span<std::byte>() { return {data(), size_}; }

 private:
  void reset() {
    if (foreign_ && release_) release_(foreign_, foreign_capacity_);
    foreign_ = nullptr;
    release_block(std::move(block_));
  }
  PooledBlock block_;
  std::byte* foreign_ = nullptr;
  void (*release_)(std::byte*, std::size_t) = nullptr;
  std::size_t foreign_capacity_ = 0;
  std::size_t size_ = 0;
};

class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  // True for device memory.
  virtual bool is_device() const = 0;
  // A view of `numel` elements of `dtype` at `data` in this space (device and stream filled in).
  virtual TensorView view(void* data, std::size_t numel, DType dtype) const = 0;
  // An uninitialized buffer of `bytes` bytes in this space (pooled: the hot path allocates nothing in steady state).
  virtual Bytes allocate(std::size_t bytes) = 0;
  // Copies `bytes` between two buffers of this space.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Copies `bytes` from this space into host memory; returns when they are there.
  virtual void read(void* host, const void* src, std::size_t bytes) = 0;
  // Reads `in` (f32, f16 or bf16, in this space) into f32 `out` (numel values, in this space).
  virtual void load_f32(const TensorView& in, float* out) = 0;
  // Writes f32 `values` into `out` (copy, or rounding to f16/bf16); nothing when out aliases values.
  virtual void store_f32(const float* values, const TensorView& out) = 0;
  // values[i] /= divisor for every i (no write when divisor is 1). Returns the count of nonzero results when
  // `count_nonzero`, else 0. Bit-identical on host and device (IEEE division).
  virtual std::size_t divide(float* values, std::size_t n, float divisor, bool count_nonzero) = 0;
  // Waits until everything queued on this space is done (before a communicator touches its buffers).
  virtual void synchronize() = 0;
};

// Host memory.
MemorySpace& host_space();
// The CUDA device and stream of `tensor` (CUDA builds; throws InvalidArgument otherwise).
std::unique_ptr<MemorySpace> cuda_space(const TensorView& tensor);

}  // namespace gradcomp::algorithms
