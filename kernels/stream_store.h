// Output stores for decoders: large overwrite decodes use non-temporal stores, which skip the read-for-ownership of
// every output cache line (a third of a decode's memory traffic) and keep the output from evicting useful data.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp::kernels {

// Decoded outputs at least this large (elements) are streamed when overwriting.
inline constexpr std::size_t kStreamMinElements = std::size_t{1} << 18;

// Whether a decode of `numel` elements into `out` should use non-temporal stores (16-byte aligned outputs only).
inline bool use_stream_stores(const float* out, std::size_t numel, bool accumulate) {
  return !accumulate && numel >= kStreamMinElements && reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
}

#if defined(__AVX2__)
// Stores 8 floats at p (p 16-byte aligned when streaming).
inline void store8(float* p, __m256 value, bool stream) {
  if (stream) {
    _mm_stream_ps(p, _mm256_castps256_ps128(value));
    _mm_stream_ps(p + 4, _mm256_extractf128_ps(value, 1));
  } else {
    _mm256_storeu_ps(p, value);
  }
}

// How a vectorized loop stores 8 floats: plain, non-temporal as two 16-byte halves (a 16-byte aligned pointer), or
// non-temporal as one 32-byte store (a 32-byte aligned pointer). Chosen once per range (see store_kind), so the hot
// loop is instantiated for one kind and has no per-store branch.
enum class StoreKind { kPlain, kStream16, kStream32 };

// The store kind for 8-float groups at p, p + 8, ... (`stream` as decided by use_stream_stores).
inline StoreKind store_kind(const float* p, bool stream) {
  if (!stream) return StoreKind::kPlain;
  return reinterpret_cast<std::uintptr_t>(p) % 32 == 0 ? StoreKind::kStream32 : StoreKind::kStream16;
}

template <StoreKind kKind>
inline void store8_as(float* p, __m256 value) {
  if constexpr (kKind == StoreKind::kStream32) {
    _mm256_stream_ps(p, value);
  } else if constexpr (kKind == StoreKind::kStream16) {
    _mm_stream_ps(p, _mm256_castps256_ps128(value));
    _mm_stream_ps(p + 4, _mm256_extractf128_ps(value, 1));
  } else {
    _mm256_storeu_ps(p, value);
  }
}
#endif

// Orders streamed stores before anything that follows (call once per thread after streaming).
inline void stream_fence(bool stream) {
#if defined(__AVX2__)
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

}  // namespace gradcomp::kernels
