// CUDA device discovery that is safe everywhere: in builds without CUDA, on machines without a driver, and on
// machines with a driver but no device, it reports "none" instead of throwing.
#pragma once

#include <string>

namespace gradcomp {

// Number of CUDA devices this process can use; 0 when gradcomp was built without CUDA, when no driver is installed
// or when no device is visible. Never throws; clears the sticky "no device" error it may cause.
int cuda_device_count() noexcept;

// Why cuda_device_count() is 0 ("built without CUDA", "no CUDA device: cudaErrorNoDevice ..."); empty when a device
// is available.
std::string cuda_unavailable_reason();

}  // namespace gradcomp
