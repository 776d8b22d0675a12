// Batched Philox on the CPU: the same bits as PhiloxStream::bits(index), computed many blocks at a time in a layout
// the compiler vectorizes (structure of arrays, fixed-length lane loops).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/philox_ops.cuh"

namespace gradcomp::kernels {

// Blocks (of 4 draws) computed together by philox_fill.
inline constexpr std::size_t kPhiloxBatchBlocks = 64;

// out[i] = stream.bits(first + i) for i in [0, count). `first` must be a multiple of 4.
inline void philox_fill(const PhiloxStream& stream, std::uint64_t first, std::size_t count, std::uint32_t* out) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::uint64_t block = first >> 2;
  std::size_t done = 0;
  while (done < count) {
    const std::size_t blocks = std::min<std::size_t>(kPhiloxBatchBlocks, (count - done + 3) / 4);
    alignas(64) std::uint32_t c0[kPhiloxBatchBlocks], c1[kPhiloxBatchBlocks], c2[kPhiloxBatchBlocks],
        c3[kPhiloxBatchBlocks];
    for (std::size_t j = 0; j < kPhiloxBatchBlocks; ++j) {
      const std::uint64_t index = block + j;
      c0[j] = static_cast<std::uint32_t>(index);
      c1[j] = static_cast<std::uint32_t>(index >> 32);
      c2[j] = stream.step_lo;
      c3[j] = stream.step_hi;
    }
    std::uint32_t k0 = stream.key.k0, k1 = stream.key.k1;
    for (int round = 0; round < 10; ++round) {
      for (std::size_t j = 0; j < kPhiloxBatchBlocks; ++j) {
        const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0[j];
        const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2[j];
        const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
        const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
        c0[j] = n0;
        c1[j] = static_cast<std::uint32_t>(p1);
        c2[j] = n2;
        c3[j] = static_cast<std::uint32_t>(p0);
      }
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const std::size_t take = std::min<std::size_t>(count - done, blocks * 4);
    if (take == blocks * 4) {
      for (std::size_t j = 0; j < blocks; ++j) {
        out[done + 4 * j] = c0[j];
        out[done + 4 * j + 1] = c1[j];
        out[done + 4 * j + 2] = c2[j];
        out[done + 4 * j + 3] = c3[j];
      }
    } else {
      for (std::size_t i = 0; i < take; ++i) {
        const std::size_t j = i / 4;
        const std::uint32_t lanes[4] = {c0[j], c1[j], c2[j], c3[j]};
        out[done + i] = lanes[i % 4];
      }
    }
    done += take;
    block += blocks;
  }
}

}  // namespace gradcomp::kernels
