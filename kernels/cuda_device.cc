#include "kernels/cuda_device.h"

#include <fmt/format.h>

#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "gradcomp/tensor.h"

#if GRADCOMP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda_check.h"
#endif

namespace gradcomp {

#if GRADCOMP_WITH_CUDA
namespace {
// cudaGetDeviceCount's status, the count, and nothing else: querying does not create a context.
cudaError_t query_devices(int& count) noexcept {
  count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    count = 0;
    (void)cudaGetLastError();  // do not leave the error for the next unrelated check to find
  }
  return status;
}
}  // namespace

int cuda_device_count() noexcept {
  int count = 0;
  (void)query_devices(count);
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = query_devices(count);
  if (status != cudaSuccess) {
    return fmt::format("no CUDA device: {} ({})", cudaGetErrorName(status), cudaGetErrorString(status));
  }
  return count > 0 ? std::string() : std::string("no CUDA device: the driver reports 0 devices");
}

DeviceScope::DeviceScope(Device device) {
  if (!device.is_cuda()) return;
  int current = 0;
  GRADCOMP_CUDA_CHECK_IN(cudaGetDevice(&current), fmt::format("making {} current", device_name(device)).c_str());
  if (current == device.index) return;
  GRADCOMP_CUDA_CHECK_IN(cudaSetDevice(device.index), fmt::format("making {} current", device_name(device)).c_str());
  previous_ = current;
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}
#else
int cuda_device_count() noexcept { return 0; }
std::string cuda_unavailable_reason() { return "no CUDA device: gradcomp was built without CUDA"; }

DeviceScope::DeviceScope(Device device) {
  if (device.is_cuda()) {
    throw InvalidArgument(fmt::format("{} cannot be made current: gradcomp was built without CUDA",
                                      device_name(device)));
  }
}

DeviceScope::~DeviceScope() = default;
#endif

}  // namespace gradcomp
