// Where a compressed collective keeps its working memory (payloads, gathered payloads, f32 sums) and the few
// operations that touch it. The algorithms (dense, allgather, sparse, scatter-reduce-allgather, hierarchical) are
// written once against this interface: on the host for CPU tensors (and for device tensors staged through a
// communicator that cannot take device memory), or on the tensor's CUDA device, ordered on the tensor's stream, when
// the communicator can (NCCL). The CPU tests run the very code the device path runs; only these operations differ.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/algorithms/buffer_pool.h"
#include "gradcomp/communicator.h"
#include "gradcomp/tensor.h"

namespace gradcomp::algorithms {

// A byte buffer that is not zero-filled on allocation (payload buffers are large and written by the codec). Its block
// comes from a per-thread BlockPool (buffer_pool.h) and goes back, when the buffer goes away, to the same kind of
// pool of the thread that frees it: `pool` names the kind (host_block_pool, or the CUDA space's device pool).
class Bytes {
 public:
  // A host buffer of `capacity` bytes; 0 holds no block (an empty holder to move a buffer into).
  explicit Bytes(std::size_t capacity)
      : Bytes(host_block_pool, capacity ? host_block_pool().acquire(capacity) : PooledBlock{}, capacity) {}
  Bytes(BlockPool& (*pool)(), PooledBlock block, std::size_t size) : block_(block), pool_(pool), size_(size) {}
  // A block of `owner`, a pool that outlives the buffer and is used by one thread (e.g. the runtime's fusion pool).
  Bytes(BlockPool& owner, std::size_t size) : block_(owner.acquire(size)), owner_(&owner), size_(size) {}
  Bytes(Bytes&& other) noexcept { *this = std::move(other); }
  Bytes& operator=(Bytes&& other) noexcept {
    if (this != &other) {
      reset();
      block_ = other.block_;
      pool_ = other.pool_;
      owner_ = other.owner_;
      size_ = other.size_;
      other.block_ = PooledBlock{};
    }
    return *this;
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  ~Bytes() { reset(); }
  std::byte* data() const { return block_.data; }
  std::size_t size() const { return size_; }
  void shrink(std::size_t size) { size_ = size; }
  std::byte* begin() const { return data(); }
  std::byte* end() const { return data() + size_; }
  operator std::span<const std::byte>() const { return {data(), size_}; }
  operator std::span<std::byte>() { return {data(), size_}; }

 private:
  void reset() {
    if (block_.data != nullptr && owner_ != nullptr) owner_->release(block_);
    if (block_.data != nullptr && pool_ != nullptr) pool_().release(block_);
    block_ = PooledBlock{};
  }
  PooledBlock block_;
  BlockPool& (*pool_)() = nullptr;
  BlockPool* owner_ = nullptr;
  std::size_t size_ = 0;
};

class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  // True for device memory.
  virtual bool is_device() const = 0;
  // Where this space's buffers live, for the communicator calls that move them.
  virtual Memory memory() const = 0;
  // A view of `numel` elements of `dtype` at `data` in this space (device and stream filled in).
  virtual TensorView view(void* data, std::size_t numel, DType dtype) const = 0;
  // An uninitialized buffer of `bytes` bytes in this space (pooled: the hot path allocates nothing in steady state).
  virtual Bytes allocate(std::size_t bytes) = 0;
  // Copies `bytes` between two buffers of this space.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Sets `bytes` bytes at `dst` (this space) to zero.
  virtual void fill_zero(void* dst, std::size_t bytes) = 0;
  // Copies `bytes` from this space into host memory; returns when they are there (one synchronization, counted).
  virtual void read(void* host, const void* src, std::size_t bytes) = 0;
  // Reads `in` (f32, f16 or bf16, in this space) into f32 `out` (numel values, in this space).
  virtual void load_f32(const TensorView& in, float* out) = 0;
  // Writes f32 `values` into `out` (copy, or rounding to f16/bf16); nothing when out aliases values.
  virtual void store_f32(const float* values, const TensorView& out) = 0;
  // values[i] /= divisor for every i (no write when divisor is 1). Returns the count of nonzero results when
  // `count_nonzero` (one synchronization, counted), else 0. Bit-identical on host and device (IEEE division).
  virtual std::size_t divide(float* values, std::size_t n, float divisor, bool count_nonzero) = 0;
  // acc[i] += x[i] for i < n (f32 buffers of this space): one IEEE addition per element, bit-identical on host and
  // device.
  virtual void add(float* acc, const float* x, std::size_t n) = 0;
  // Waits until everything queued on this space is done (before a communicator touches its buffers).
  //
  // The host space counts read(), synchronize() and a counting divide() as synchronizations exactly as the device
  // space does (kernels/usage_counters.h), although on the host they wait for nothing: the CPU tests of the
  // algorithms therefore check the device path's synchronization count (AllreduceStats::synchronizations).
  virtual void synchronize() = 0;
};

// Host memory.
MemorySpace& host_space();
// The CUDA device and stream of `tensor` (CUDA builds; throws InvalidArgument otherwise).
std::unique_ptr<MemorySpace> cuda_space(const TensorView& tensor);

}  // namespace gradcomp::algorithms
