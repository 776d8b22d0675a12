// Batched Philox on the CPU: the same bits as PhiloxStream::bits(index), 8 blocks (32 draws) at a time with AVX2
// where available; the scalar remainder uses PhiloxStream::block directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/philox_ops.cuh"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp::kernels {

#if defined(__AVX2__)
// Philox 4x32-10 of the 8 blocks first_block .. first_block+7; writes their 32 draws in element order.
inline void philox8_avx2(const PhiloxStream& stream, std::uint64_t first_block, std::uint32_t* out) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const std::uint64_t last = first_block + 7;
  __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first_block))), lane);
  __m256i c1;
  if ((first_block >> 32) == (last >> 32)) {
    c1 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first_block >> 32)));
  } else {  // the low word wraps inside this batch
    alignas(32) std::uint32_t hi[8];
    for (int j = 0; j < 8; ++j) hi[j] = static_cast<std::uint32_t>((first_block + j) >> 32);
    c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
  }
  __m256i c2 = _mm256_set1_epi32(static_cast<int>(stream.step_lo));
  __m256i c3 = _mm256_set1_epi32(static_cast<int>(stream.step_hi));
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  std::uint32_t k0 = stream.key.k0, k1 = stream.key.k1;
  for (int round = 0; round < 10; ++round) {
    const __m256i p0e = _mm256_mul_epu32(c0, m0);
    const __m256i p0o = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
    const __m256i p1e = _mm256_mul_epu32(c2, m1);
    const __m256i p1o = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
    const __m256i lo0 = _mm256_blend_epi32(p0e, _mm256_slli_epi64(p0o, 32), 0xAA);
    const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(p0e, 32), p0o, 0xAA);
    const __m256i lo1 = _mm256_blend_epi32(p1e, _mm256_slli_epi64(p1o, 32), 0xAA);
    const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(p1e, 32), p1o, 0xAA);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  auto* dst = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(dst + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
  _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
  _mm256_storeu_si256(dst + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
  _mm256_storeu_si256(dst + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
}
#endif

// out[i] = stream.bits(first + i) for i in [0, count). `first` must be a multiple of 4.
inline void philox_fill(const PhiloxStream& stream, std::uint64_t first, std::size_t count, std::uint32_t* out) {
  std::uint64_t block = first >> 2;
  std::size_t done = 0;
#if defined(__AVX2__)
  for (; done + 32 <= count; done += 32, block += 8) philox8_avx2(stream, block, out + done);
#endif
  for (; done < count; done += 4, ++block) {
    const Philox4 draws = stream.block(block);
    for (std::size_t w = 0; w < 4 && done + w < count; ++w) out[done + w] = draws.v[w];
  }
}

}  // namespace gradcomp::kernels
