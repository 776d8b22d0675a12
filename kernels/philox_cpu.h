// Batched Philox on the CPU: the same bits as PhiloxStream::bits(index), 8 blocks (32 draws) at a time with AVX2
// where available; the scalar remainder uses PhiloxStream::block directly.
//
// The AVX2 generator keeps each 32-bit counter word in the even 32-bit slots of 64-bit lanes (4 blocks per
// register, two registers per word for 8 blocks): _mm256_mul_epu32 then yields the full 64-bit product with the
// low word in the even slot, so a round costs two multiplies, two shifts (high words down) and four XORs per 4
// blocks, with the ten round keys precomputed once per stream (PhiloxAvx2). Odd slots hold junk that is never read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/philox_ops.cuh"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gradcomp::kernels {

#if defined(__AVX2__)
// Philox 4x32-10 of one stream, 8 consecutive blocks at a time; round keys broadcast once at construction.
class PhiloxAvx2 {
 public:
  explicit PhiloxAvx2(const PhiloxStream& stream)
      : step_lo_(_mm256_set1_epi32(static_cast<int>(stream.step_lo))),
        step_hi_(_mm256_set1_epi32(static_cast<int>(stream.step_hi))) {
    std::uint32_t k0 = stream.key.k0, k1 = stream.key.k1;
    for (int round = 0; round < 10; ++round) {
      key0_[round] = _mm256_set1_epi32(static_cast<int>(k0));
      key1_[round] = _mm256_set1_epi32(static_cast<int>(k1));
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  // Blocks first .. first+7: w[h][k] holds word k of blocks first+4h .. first+4h+3, one block per 64-bit lane, in
  // the lane's low 32 bits (the high 32 bits are junk).
  void blocks(std::uint64_t first, __m256i (&w)[2][4]) const {
    const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
    __m256i c0[2], c1[2], c2[2], c3[2];
    for (int h = 0; h < 2; ++h) {
      // 64-bit block indices: the low word is counter word 0, the high word counter word 1 (wraps carry over).
      const __m256i index = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first)),
                                             _mm256_setr_epi64x(4 * h, 4 * h + 1, 4 * h + 2, 4 * h + 3));
      c0[h] = index;
      c1[h] = _mm256_srli_epi64(index, 32);
      c2[h] = step_lo_;
      c3[h] = step_hi_;
    }
    for (int round = 0; round < 10; ++round) {
      for (int h = 0; h < 2; ++h) {
        const __m256i p0 = _mm256_mul_epu32(c0[h], m0);  // lo0 | hi0 << 32
        const __m256i p1 = _mm256_mul_epu32(c2[h], m1);  // lo1 | hi1 << 32
        c0[h] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(c1[h], key0_[round]));
        c2[h] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(c3[h], key1_[round]));
        c1[h] = p1;
        c3[h] = p0;
      }
    }
    for (int h = 0; h < 2; ++h) {
      w[h][0] = c0[h];
      w[h][1] = c1[h];
      w[h][2] = c2[h];
      w[h][3] = c3[h];
    }
  }

  // Block j's four words (w0, w1, w2, w3) in the 128-bit lanes of two registers: lo = (block 4h, block 4h+2),
  // hi = (block 4h+1, block 4h+3), for half h of a blocks() result.
  static void interleave(const __m256i (&w)[4], __m256i& lo, __m256i& hi) {
    const __m256i w01 = _mm256_blend_epi32(w[0], _mm256_slli_epi64(w[1], 32), 0xAA);
    const __m256i w23 = _mm256_blend_epi32(w[2], _mm256_slli_epi64(w[3], 32), 0xAA);
    lo = _mm256_unpacklo_epi64(w01, w23);
    hi = _mm256_unpackhi_epi64(w01, w23);
  }

  // Draws (stream.bits) of the 8 blocks first .. first+7, in element order: out[4j + k] = word k of block first+j.
  void fill32(std::uint64_t first, std::uint32_t* out) const {
    __m256i w[2][4];
    blocks(first, w);
    auto* dst = reinterpret_cast<__m256i*>(out);
    for (int h = 0; h < 2; ++h) {
      __m256i lo, hi;
      interleave(w[h], lo, hi);
      _mm256_storeu_si256(dst + 2 * h, _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(dst + 2 * h + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
  }

  // The 64 uniforms signmag_uniform(bits((8 first + i) / 2), i) of elements 8 first + i, i < 64 (8 per block: the
  // 16-bit halves of its 4 draws, low half first), as floats in [0, 1): out[i], 32-byte aligned.
  void uniforms64(std::uint64_t first, float* out) const {
    __m256i w[2][4];
    blocks(first, w);
    const __m256 to_unit = _mm256_set1_ps(1.0f / 65536.0f);
    auto put = [&](int block, __m128i words) {
      const __m256i halves = _mm256_cvtepu16_epi32(words);
      _mm256_store_ps(out + 8 * block, _mm256_mul_ps(_mm256_cvtepi32_ps(halves), to_unit));
    };
    for (int h = 0; h < 2; ++h) {
      __m256i lo, hi;
      interleave(w[h], lo, hi);
      put(4 * h, _mm256_castsi256_si128(lo));
      put(4 * h + 1, _mm256_castsi256_si128(hi));
      put(4 * h + 2, _mm256_extracti128_si256(lo, 1));
      put(4 * h + 3, _mm256_extracti128_si256(hi, 1));
    }
  }

 private:
  __m256i key0_[10], key1_[10];
  __m256i step_lo_, step_hi_;
};

// Philox 4x32-10 of the 8 blocks first_block .. first_block+7; writes their 32 draws in element order.
inline void philox8_avx2(const PhiloxStream& stream, std::uint64_t first_block, std::uint32_t* out) {
  PhiloxAvx2(stream).fill32(first_block, out);
}
#endif

// out[i] = stream.bits(first + i) for i in [0, count). `first` must be a multiple of 4.
inline void philox_fill(const PhiloxStream& stream, std::uint64_t first, std::size_t count, std::uint32_t* out) {
  std::uint64_t block = first >> 2;
  std::size_t done = 0;
#if defined(__AVX2__)
  if (count >= 32) {
    const PhiloxAvx2 generator(stream);
    for (; done + 32 <= count; done += 32, block += 8) generator.fill32(block, out + done);
  }
#endif
  for (; done < count; done += 4, ++block) {
    const Philox4 draws = stream.block(block);
    for (std::size_t w = 0; w < 4 && done + w < count; ++w) out[done + w] = draws.v[w];
  }
}

}  // namespace gradcomp::kernels
