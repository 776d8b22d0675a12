// Sign-magnitude codes and their bit packing, shared by QSGD, TernGrad and 1-bit (host and device).
//
// A `bits`-wide code holds the sign in its top bit and a level 0 .. 2^(bits-1)-1 below it. Codes are packed as a
// little-endian bit stream: code i occupies bits [i*bits, (i+1)*bits) of the section, so 8 codes fill exactly `bits`
// bytes and a group of 8 codes starting at a multiple of 8 is byte-aligned. Every code value decodes to something
// valid (a level never exceeds the field), so a decoder need not validate codes, only section sizes and scales.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.cuh"

namespace gradcomp::kernels {

// Bytes that `count` codes of `bits` bits occupy.
GRADCOMP_HOST_DEVICE std::uint64_t packed_bytes(std::uint64_t count, unsigned bits) {
  return (count * bits + 7u) / 8u;
}

// Packs 8 codes (each < 2^bits, bits <= 8) into `bits` bytes at `out`.
GRADCOMP_HOST_DEVICE void pack8(const std::uint8_t* codes, unsigned bits, std::uint8_t* out) {
  std::uint64_t word = 0;
  for (unsigned k = 0; k < 8; ++k) word |= static_cast<std::uint64_t>(codes[k]) << (k * bits);
  for (unsigned b = 0; b < bits; ++b) out[b] = static_cast<std::uint8_t>(word >> (8u * b));
}

// Unpacks 8 codes of `bits` bits from `bits` bytes at `in`.
GRADCOMP_HOST_DEVICE void unpack8(const std::uint8_t* in, unsigned bits, std::uint8_t* codes) {
  std::uint64_t word = 0;
  for (unsigned b = 0; b < bits; ++b) word |= static_cast<std::uint64_t>(in[b]) << (8u * b);
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1u;
  for (unsigned k = 0; k < 8; ++k) codes[k] = static_cast<std::uint8_t>((word >> (k * bits)) & mask);
}

// The IEEE sign bit of `value` (1 for -0.0 and negative NaNs too).
GRADCOMP_HOST_DEVICE std::uint32_t sign_bit(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits >> 31;
}

}  // namespace gradcomp::kernels
