// Owning device memory and a current-device guard, for the host side of the CUDA path (CUDA builds only).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "gradcomp/tensor.h"

namespace gradcomp::kernels {

// Makes CUDA device `device` current for its lifetime and restores the previous device afterwards (DeviceScope).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : scope_(Device::cuda(device)) {}

 private:
  DeviceScope scope_;
};

// Where a CudaBlock's memory comes from: device memory (cudaMalloc) or page-locked host memory (cudaMallocHost).
enum class CudaBlockKind { kDevice, kPinnedHost };

// A block of `Kind` memory, freed by the destructor. Move-only. reserve() only ever grows it, so a workspace sized once
// by the largest request is never reallocated on later calls (no allocation on the hot path); each growth is counted
// (kernels/usage_counters.h).
template <CudaBlockKind Kind>
class CudaBlock {
 public:
  CudaBlock() = default;
  explicit CudaBlock(std::size_t bytes) { reserve(bytes); }
  ~CudaBlock() { release(); }
  CudaBlock(CudaBlock&& other) noexcept { swap(other); }
  CudaBlock& operator=(CudaBlock&& other) noexcept {
    if (this != &other) {
      release();
      swap(other);
    }
    return *this;
  }
  CudaBlock(const CudaBlock&) = delete;
  CudaBlock& operator=(const CudaBlock&) = delete;

  // Ensures at least `bytes` bytes (on the current device for kDevice); when it must grow, the old contents are lost.
  // Returns data(). Throws CudaError when the allocation fails.
  void* reserve(std::size_t bytes);
  void release() noexcept;
  void swap(CudaBlock& other) noexcept;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A cudaMalloc'd block on one device.
using DeviceBuffer = CudaBlock<CudaBlockKind::kDevice>;
// Page-locked host memory (cudaMallocHost). A host-to-device cudaMemcpyAsync from it is truly asynchronous, so the
// owner must not rewrite the bytes before the copy has run (the CUDA path reuses it only after a stream
// synchronization).
using PinnedBuffer = CudaBlock<CudaBlockKind::kPinnedHost>;

extern template class CudaBlock<CudaBlockKind::kDevice>;
extern template class CudaBlock<CudaBlockKind::kPinnedHost>;

// A CUDA event (timing disabled) that marks where a stream last used a resource, so that work on another stream, or
// the host, waits for exactly that point. Created lazily on the current device by the first record(). Move-only.
class StreamMark {
 public:
  StreamMark() = default;
  ~StreamMark();
  StreamMark(StreamMark&& other) noexcept { swap(other); }
  StreamMark& operator=(StreamMark&& other) noexcept {
    swap(other);
    return *this;
  }
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;

  // Marks the current end of `stream`'s work.
  void record(cudaStream_t stream);
  // Makes `stream` wait (on the device, the host does not block) for the marked point; a no-op before the first
  // record() (and, on the stream that recorded it, already implied by stream order).
  void order_before(cudaStream_t stream) const;
  // Blocks the host until the marked point has run (counted as a synchronization, kernels/usage_counters.h); a no-op
  // before the first record().
  void wait_host() const;
  // True once the marked point has run (or before the first record()); never blocks. Throws CudaError on a fault.
  bool reached() const;
  void swap(StreamMark& other) noexcept;

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

// cudaStreamSynchronize(stream), counted (kernels/usage_counters.h): the one way the CUDA path makes the host wait for
// a stream, so AllreduceStats::synchronizations sees every wait.
void synchronize_stream(cudaStream_t stream);

// Carves aligned pieces out of one workspace block. With a null base it only counts (the CUB-style size query:
// call once with null to learn the bytes, then again with a block of that size).
class WorkspaceCarver {
 public:
  WorkspaceCarver(void* base, std::size_t capacity) : base_(static_cast<std::byte*>(base)), capacity_(capacity) {}

  // The next `count` elements of T, 256-byte aligned; null in query mode. Throws InvalidArgument (via an assert) when
  // the block is too small.
  template <typename T>
  T* take(std::size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(std::size_t bytes);
  std::size_t used() const { return used_; }
  bool querying() const { return base_ == nullptr; }

 private:
  std::byte* base_;
  std::size_t capacity_;
  std::size_t used_ = 0;
};

}  // namespace gradcomp::kernels
