// Payload validation is written once (compressors/framework/sparse_checks.h): every corrupt payload of
// tests/gpu/corrupt_payloads.h is refused by the CUDA decoder with the very message the CPU decoder gives
// (tests/compressors/payload_checks_test.cc is the CPU half), and the device output is left untouched.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "tests/gpu/corrupt_payloads.h"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;

std::string cpu_message(const corrupt::Case& c, const std::vector<std::byte>& bytes) {
  auto decoder = make_compressor(c.spec);
  std::vector<float> out(corrupt::kNumel, 0.0f);
  try {
    decoder->decompress(bytes, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  } catch (const CorruptPayload& e) {
    return e.what();
  }
  return "(accepted)";
}

class CorruptPayloadsGpu : public ::testing::TestWithParam<corrupt::Case> {};

TEST_P(CorruptPayloadsGpu, CudaDecoderRefusesWithTheCpuMessage) {
  const corrupt::Case& c = GetParam();
  std::vector<std::byte> bytes = corrupt::valid_payload(c.spec);
  const std::string expected = c.corrupt(bytes);
  EXPECT_EQ(cpu_message(c, bytes), expected) << c.name;
  for (const bool on_device : {true, false}) {  // a device payload, and a host one staged by the decoder
    DeviceArray<std::byte> device(bytes);
    const PayloadBytes payload = on_device ? PayloadBytes(std::span<const std::byte>(device.data(), bytes.size()),
                                                          Memory::on(Device::cuda(0), nullptr))
                                           : PayloadBytes(bytes);
    auto decoder = make_compressor(c.spec);
    DeviceArray<float> out(std::vector<float>(corrupt::kNumel, 3.0f));
    const TensorView view(out.data(), corrupt::kNumel, DType::kF32, Device::cuda(0));
    try {
      decoder->decompress(payload, view, DecodeMode::kOverwrite);
      ADD_FAILURE() << c.name << ": the corrupt payload was accepted on the GPU";
    } catch (const CorruptPayload& e) {
      EXPECT_EQ(std::string(e.what()), expected) << c.name << (on_device ? " (device payload)" : " (host payload)");
    }
    EXPECT_EQ(out.download(), std::vector<float>(corrupt::kNumel, 3.0f)) << c.name << ": the output was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Sparse, CorruptPayloadsGpu, ::testing::ValuesIn(corrupt::cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
