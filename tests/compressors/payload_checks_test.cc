// The CPU half of tests/gpu/payload_checks_gpu_test.cc: each corrupt payload of tests/gpu/corrupt_payloads.h is
// refused by the CPU decoder with exactly the message the case names (the CUDA decoder must give the same one), and
// the output is left untouched.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "tests/gpu/corrupt_payloads.h"

namespace gradcomp {
namespace {

class CorruptPayloads : public ::testing::TestWithParam<corrupt::Case> {};

TEST_P(CorruptPayloads, CpuDecoderRefusesWithTheSharedMessage) {
  const corrupt::Case& c = GetParam();
  std::vector<std::byte> bytes = corrupt::valid_payload(c.spec);
  auto decoder = make_compressor(c.spec);
  std::vector<float> out(corrupt::kNumel, 3.0f);
  decoder->decompress(bytes, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);  // valid as made
  const std::string expected = c.corrupt(bytes);
  std::vector<float> untouched(corrupt::kNumel, 3.0f);
  try {
    decoder->decompress(bytes, TensorView::of(std::span<float>(untouched)), DecodeMode::kOverwrite);
    FAIL() << c.name << ": the corrupt payload was accepted";
  } catch (const CorruptPayload& e) {
    EXPECT_EQ(std::string(e.what()), expected) << c.name;
  }
  EXPECT_EQ(untouched, std::vector<float>(corrupt::kNumel, 3.0f)) << c.name << ": a corrupt payload wrote output";
}

INSTANTIATE_TEST_SUITE_P(Sparse, CorruptPayloads, ::testing::ValuesIn(corrupt::cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gradcomp
