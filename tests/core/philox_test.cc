#include <gtest/gtest.h>

#include <set>

#include "kernels/philox_ops.cuh"

namespace gradcomp::kernels {
namespace {

// Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  const Philox4 zero = philox4x32_10(Philox4{{0, 0, 0, 0}}, PhiloxKey{0, 0});
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);

  const Philox4 ones = philox4x32_10(Philox4{{~0u, ~0u, ~0u, ~0u}}, PhiloxKey{~0u, ~0u});
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);

  const Philox4 pi = philox4x32_10(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                   PhiloxKey{0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Philox, StreamsDifferBySeedTensorAndStep) {
  const auto a = PhiloxStream::make(1, 10, 0);
  const auto b = PhiloxStream::make(2, 10, 0);
  const auto c = PhiloxStream::make(1, 11, 0);
  const auto d = PhiloxStream::make(1, 10, 1);
  std::set<std::uint32_t> draws{a.bits(0), b.bits(0), c.bits(0), d.bits(0)};
  EXPECT_EQ(draws.size(), 4u);
  EXPECT_EQ(a.bits(5), PhiloxStream::make(1, 10, 0).bits(5));
}

TEST(Philox, UniformIsInUnitIntervalAndRoughlyUniform) {
  const auto stream = PhiloxStream::make(42, 7, 3);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = uniform01(stream.bits(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // mean of n uniforms has sd 1/sqrt(12 n) ~ 0.0009; 5 sd tolerance
  EXPECT_NEAR(sum / n, 0.5, 0.0046);
}

TEST(Fnv, KnownHashes) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
}

}  // namespace
}  // namespace gradcomp::kernels
