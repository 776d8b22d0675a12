// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based generator,
// so every element's random draw is a pure function of (seed, tensor key, step, element index). The CPU loops and
// the CUDA kernels produce identical bits, for any thread count, and ranks agree without communicating.
#pragma once

#include <cstdint>

#include "kernels/fnv1a.cuh"  // fnv1a64: the tensor key of a name
#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

struct PhiloxKey {
  std::uint32_t k0, k1;
};

struct Philox4 {
  std::uint32_t v[4];
};

GRADCOMP_HOST_DEVICE void philox_mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b);
  hi = static_cast<std::uint32_t>(product >> 32);
  lo = static_cast<std::uint32_t>(product);
}

// Ten rounds of Philox 4x32 on `counter` under `key`.
GRADCOMP_HOST_DEVICE Philox4 philox4x32_10(Philox4 counter, PhiloxKey key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, counter.v[0], hi0, lo0);
    philox_mulhilo(kMul1, counter.v[2], hi1, lo1);
    counter = Philox4{{hi1 ^ counter.v[1] ^ key.k0, lo1, hi0 ^ counter.v[3] ^ key.k1, lo0}};
    key.k0 += kWeyl0;
    key.k1 += kWeyl1;
  }
  return counter;
}

// The random stream of one (seed, tensor, step): block j yields the four draws of elements 4j .. 4j+3.
struct PhiloxStream {
  PhiloxKey key;
  std::uint32_t step_lo, step_hi;

  GRADCOMP_HOST_DEVICE static PhiloxStream make(std::uint64_t seed, std::uint64_t tensor_key, std::uint64_t step) {
    const std::uint64_t mixed = seed ^ (tensor_key * 0x9E3779B97F4A7C15ull);
    return PhiloxStream{{static_cast<std::uint32_t>(mixed), static_cast<std::uint32_t>(mixed >> 32)},
                        static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)};
  }

  GRADCOMP_HOST_DEVICE Philox4 block(std::uint64_t block_index) const {
    return philox4x32_10(Philox4{{static_cast<std::uint32_t>(block_index),
                                  static_cast<std::uint32_t>(block_index >> 32), step_lo, step_hi}},
                         key);
  }

  // The 32 random bits of element `index`.
  GRADCOMP_HOST_DEVICE std::uint32_t bits(std::uint64_t index) const { return block(index >> 2).v[index & 3]; }
};

// Uniform float in [0, 1) with 24 random bits.
GRADCOMP_HOST_DEVICE float uniform01(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace gradcomp::kernels
