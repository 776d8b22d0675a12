// A payload says where it lives (PayloadBytes: host, or a CUDA device's memory, labelled by the caller; no codec
// probes a pointer). A CPU output takes host payloads only: a payload labelled as device memory is refused with
// InvalidArgument naming the codec and both places, before anything is written, by decompress() and
// decompress_sum() alike. (The CUDA side, host and device payloads into a CUDA output: tests/gpu/codec_parity.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

const Memory kDevice = Memory::on(Device::cuda(0), nullptr);

std::vector<float> values(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>(i * 37 % 101) - 50) / 8.0f;
  return v;
}

class PayloadMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(PayloadMemory, ACpuOutputRefusesADevicePayloadAndStaysUntouched) {
  const std::size_t n = 1000;
  auto codec = make_compressor(GetParam());
  CompressContext ctx;
  ctx.name = "w";
  const auto grad = values(n);
  TensorView grad_view = TensorView::of(std::span<const float>(grad));
  if (codec->traits().rounds) grad_view = grad_view.with_rows(20);
  const std::vector<std::byte> payload = compress_to_vector(*codec, grad_view, ctx);
  std::vector<float> out(n, 3.0f);
  const TensorView out_view = TensorView::of(std::span<float>(out));
  try {
    codec->decompress(PayloadBytes(payload, kDevice), out_view, DecodeMode::kOverwrite);
    FAIL() << GetParam() << ": a payload labelled cuda:0 was decoded into a CPU tensor";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out, std::vector<float>(n, 3.0f)) << GetParam();
  // decompress_sum: one device payload among host ones is refused before the first is written.
  const std::vector<PayloadBytes> mixed = {PayloadBytes(payload), PayloadBytes(payload, kDevice)};
  EXPECT_THROW(codec->decompress_sum(mixed, out_view, DecodeMode::kOverwrite), InvalidArgument) << GetParam();
  EXPECT_EQ(out, std::vector<float>(n, 3.0f)) << GetParam();
  // The same bytes labelled host decode.
  codec->decompress(payload, out_view, DecodeMode::kOverwrite);
  EXPECT_NE(out, std::vector<float>(n, 3.0f)) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Codecs, PayloadMemory,
                         ::testing::Values("none", "fp16", "qsgd:bits=4", "onebit", "topk:ratio=0.1", "dgc:ratio=0.1",
                                           "randomk:ratio=0.1", "blocktopk:ratio=0.1,block=8", "powersgd:rank=2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace gradcomp
