// Counters a CUDA encode reports back to the host (one small device struct per call).
#pragma once

namespace gradcomp::kernels {

struct DeviceCounters {
  unsigned long long nonfinite;  // NaN/Inf values in the gradient
  unsigned long long saturated;  // values clamped to the wire type's range
  unsigned long long selected;   // elements transmitted (sparsifiers)
  unsigned long long spare;
};

}  // namespace gradcomp::kernels
