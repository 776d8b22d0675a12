#include "comm/host_copy.h"

#include <fmt/format.h>

#include "gradcomp/config.h"
#include "gradcomp/error.h"

#if GRADCOMP_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_buffer.h"
#include "kernels/cuda_check.h"
#endif

namespace gradcomp::comm {
namespace {

#if GRADCOMP_WITH_CUDA
void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind, void* stream) {
  if (bytes == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  GRADCOMP_CUDA_CHECK_IN(cudaMemcpyAsync(to, from, bytes, kind, s), "host staging");
  kernels::synchronize_stream(s);
}
#endif

}  // namespace

HostCopy::HostCopy(void* device_data, std::size_t bytes, Memory memory, bool copy_in)
    : device_data_(device_data), bytes_(bytes), memory_(memory), host_(bytes) {
  GRADCOMP_CHECK(!memory.is_host(), "HostCopy: the memory at {} is host memory already", device_data);
#if GRADCOMP_WITH_CUDA
  if (copy_in) copy(host_.data(), device_data_, bytes_, cudaMemcpyDeviceToHost, memory_.stream);
#else
  (void)copy_in;
  throw InvalidArgument(fmt::format("{} bytes on {}: gradcomp was built without CUDA", bytes,
                                    device_name(memory.device)));
#endif
}

void HostCopy::copy_back() {
#if GRADCOMP_WITH_CUDA
  copy(device_data_, host_.data(), bytes_, cudaMemcpyHostToDevice, memory_.stream);
#endif
}

}  // namespace gradcomp::comm

namespace gradcomp {

std::size_t with_memory_taken(Communicator& comm, const TensorView& view,
                              const std::function<void(const TensorView&)>& call) {
  if (comm.takes(view.device())) {
    call(view);
    return 0;
  }
  comm::HostCopy copy(view);
  call(copy.host_view());
  copy.copy_back();
  return 2 * view.bytes();
}

}  // namespace gradcomp
