#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include "kernels/cuda_buffer.h"

#include <utility>

#include "gradcomp/error.h"
#include "kernels/cuda_check.h"
#include "kernels/usage_counters.h"

namespace gradcomp::kernels {

template <CudaBlockKind Kind>
void* CudaBlock<Kind>::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return data_;
  release();
  void* data = nullptr;
  if constexpr (Kind == CudaBlockKind::kDevice) {
    GRADCOMP_CUDA_CHECK(cudaMalloc(&data, bytes));
  } else {
    GRADCOMP_CUDA_CHECK(cudaMallocHost(&data, bytes));
  }
  note_allocation();
  data_ = data;
  bytes_ = bytes;
  return data_;
}

template <CudaBlockKind Kind>
void CudaBlock<Kind>::release() noexcept {
  if (data_) (void)(Kind == CudaBlockKind::kDevice ? cudaFree(data_) : cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
}

template <CudaBlockKind Kind>
void CudaBlock<Kind>::swap(CudaBlock& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
}

template class CudaBlock<CudaBlockKind::kDevice>;
template class CudaBlock<CudaBlockKind::kPinnedHost>;

StreamMark::~StreamMark() {
  if (event_) (void)cudaEventDestroy(event_);
}

void StreamMark::record(cudaStream_t stream) {
  if (!event_) GRADCOMP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  GRADCOMP_CUDA_CHECK(cudaEventRecord(event_, stream));
  recorded_ = true;
}

void StreamMark::order_before(cudaStream_t stream) const {
  if (recorded_) GRADCOMP_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void StreamMark::wait_host() const {
  if (!recorded_) return;
  note_synchronization();
  GRADCOMP_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool StreamMark::reached() const {
  if (!recorded_) return true;
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  GRADCOMP_CUDA_CHECK(status);
  return true;
}

void synchronize_stream(cudaStream_t stream) {
  note_synchronization();
  GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void StreamMark::swap(StreamMark& other) noexcept {
  std::swap(event_, other.event_);
  std::swap(recorded_, other.recorded_);
}

void* WorkspaceCarver::take_bytes(std::size_t bytes) {
  constexpr std::size_t kAlign = 256;
  const std::size_t offset = (used_ + kAlign - 1) / kAlign * kAlign;
  used_ = offset + bytes;
  if (base_ == nullptr) return nullptr;
  GRADCOMP_ASSERT(used_ <= capacity_, "CUDA workspace of {} bytes is too small ({} needed so far)", capacity_, used_);
  return base_ + offset;
}

}  // namespace gradcomp::kernels
#endif
