// The memory traffic a compress + error-feedback + decompress round trip must move, the numerator of every
// "fraction of memcpy" figure (bench/kernels, gradcomp probe). memcpy of B bytes moves 2B (read + write).
#pragma once

#include <cstddef>

namespace gradcomp {

// Bytes moved by one compress (read grad; read+write residual when error feedback is on; write payload) plus one
// decompress (read payload, write output), for f32 tensors of `numel` elements.
inline std::size_t round_trip_bytes(std::size_t numel, std::size_t payload_bytes, bool error_feedback) {
  const std::size_t values = numel * sizeof(float);
  return values + (error_feedback ? 2 * values : 0) + 2 * payload_bytes + values;
}

}  // namespace gradcomp
