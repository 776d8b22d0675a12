// The one hash of the library: 64-bit FNV-1a, on the host and the device. It keys the random streams of a tensor by
// its name (kernels/philox_ops.cuh, compressors' segment_stream_key) and checks checkpoint records for damage
// (src/runtime/checkpoint.cc); a value it gives never changes, since saved state and random streams depend on it.
#pragma once

#include <cstdint>

#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

// 64-bit FNV-1a of `length` bytes at `data`.
GRADCOMP_HOST_DEVICE std::uint64_t fnv1a64(const char* data, std::uint64_t length) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::uint64_t i = 0; i < length; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace gradcomp::kernels
