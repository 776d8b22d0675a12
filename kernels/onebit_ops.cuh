// 1-bit / EF-signSGD per-element math (Seide et al. 2014; Karimireddy et al. 2019), identical on host and device.
//
// A bucket of n values is sent as its scale S = (1/n) * sum |v| and one bit per value: the IEEE sign bit (so -0.0
// sends -S). The decoded value is bit ? -S : S.
#pragma once

#include <cstdint>

#include "kernels/bitpack_ops.cuh"
#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

GRADCOMP_HOST_DEVICE std::uint32_t onebit_encode(float value) { return sign_bit(value); }

GRADCOMP_HOST_DEVICE float onebit_decode(std::uint32_t bit, float scale) { return bit ? -scale : scale; }

}  // namespace gradcomp::kernels
