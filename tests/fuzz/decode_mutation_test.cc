// Deterministic decoder robustness over every registered codec, so CI covers the decoders without clang/libFuzzer:
// valid payloads truncated at every length, every byte flipped, random garbage behind a valid header, and random
// inputs in the fuzz target's format. Each decode must succeed or throw CorruptPayload / InvalidArgument leaving the
// output untouched (under -DGRADCOMP_SANITIZE=ON, ASan also proves every write in bounds).
#include <gtest/gtest.h>

#include "decode_harness.h"

namespace gradcomp::fuzz {
namespace {

std::uint8_t random_byte(const kernels::PhiloxStream& stream, std::uint64_t i) {
  return static_cast<std::uint8_t>(stream.bits(i) >> 24);
}

class DecodeMutation : public ::testing::Test {
 protected:
  DecodeHarness harness;
};

TEST_F(DecodeMutation, EveryRegisteredCodecIsCovered) {
  for (const auto& info : default_registry().list()) {
    bool found = false;
    for (std::size_t i = 0; i < harness.size(); ++i) found |= harness.spec(i) == info.name;
    EXPECT_TRUE(found) << info.name;
  }
  EXPECT_GE(harness.size(), 5u);
}

TEST_F(DecodeMutation, ValidPayloadsDecodeAndTruncationsAreRejected) {
  for (std::size_t c = 0; c < harness.size(); ++c) {
    for (const std::size_t numel : {0u, 1u, 7u, 300u}) {
      const auto payload = harness.valid_payload(c, numel, numel);
      ASSERT_FALSE(payload.empty()) << harness.spec(c);
      for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
        EXPECT_EQ(harness.decode(c, payload, numel, dtype, DecodeMode::kOverwrite), Outcome::kDecoded)
            << harness.spec(c) << " numel " << numel;
        EXPECT_EQ(harness.decode(c, payload, numel, dtype, DecodeMode::kAccumulate), Outcome::kDecoded);
      }
      // The wrong output size is refused.
      EXPECT_EQ(harness.decode(c, payload, numel + 1, DType::kF32, DecodeMode::kOverwrite), Outcome::kRejected);
      for (std::size_t length = 0; length < payload.size(); ++length) {
        EXPECT_EQ(harness.decode(c, std::span(payload).first(length), numel, DType::kF32, DecodeMode::kOverwrite),
                  Outcome::kRejected)
            << harness.spec(c) << " truncated to " << length << " of " << payload.size();
      }
    }
  }
}

TEST_F(DecodeMutation, FlippedBytesNeverBreakTheContract) {
  for (std::size_t c = 0; c < harness.size(); ++c) {
    for (const std::size_t numel : {5u, 300u}) {
      const auto payload = harness.valid_payload(c, numel, 17);
      std::size_t rejected = 0;
      for (std::size_t at = 0; at < payload.size(); ++at) {
        for (const std::uint8_t flip : {0x01, 0x10, 0x80, 0xff}) {
          auto bytes = payload;
          bytes[at] ^= std::byte{flip};
          for (const DecodeMode mode : {DecodeMode::kOverwrite, DecodeMode::kAccumulate}) {
            rejected += harness.decode(c, bytes, numel, DType::kF32, mode) == Outcome::kRejected;
          }
        }
      }
      // Header corruptions (magic, version, codec, numel, sections) at least must be caught.
      EXPECT_GT(rejected, 40u) << harness.spec(c);
    }
  }
}

TEST_F(DecodeMutation, GarbageBehindAValidHeaderIsHandled) {
  for (std::size_t c = 0; c < harness.size(); ++c) {
    const std::size_t numel = 200;
    const auto payload = harness.valid_payload(c, numel, 3);
    for (std::uint64_t trial = 0; trial < 200; ++trial) {
      const auto stream = kernels::PhiloxStream::make(trial, c, 0xbad);
      auto bytes = payload;
      for (std::size_t i = payload::kHeaderBytes; i < bytes.size(); ++i) {
        bytes[i] = std::byte{random_byte(stream, i)};
      }
      // Also random codec parameters (param0/param1) on some trials.
      if (trial % 4 == 1) {
        for (std::size_t i = 24; i < 32; ++i) bytes[i] = std::byte{random_byte(stream, 5000 + i)};
      }
      harness.decode(c, bytes, numel, DType::kF32, trial % 2 ? DecodeMode::kAccumulate : DecodeMode::kOverwrite);
    }
  }
}

TEST_F(DecodeMutation, RandomFuzzFormatInputs) {
  // The libFuzzer input format, with random bytes: raw payloads and valid-then-mutated ones.
  std::vector<std::uint8_t> input;
  for (std::uint64_t trial = 0; trial < 4000; ++trial) {
    const auto stream = kernels::PhiloxStream::make(trial, 0xf022, 1);
    const std::size_t size = 2 + stream.bits(0) % 200;
    input.resize(size);
    for (std::size_t i = 0; i < size; ++i) input[i] = random_byte(stream, i + 1);
    ASSERT_NO_THROW(run_one_input(harness, input.data(), input.size())) << "trial " << trial;
  }
}

}  // namespace
}  // namespace gradcomp::fuzz
