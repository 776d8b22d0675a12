// Compressor::decompress_sum on the CPU: several payloads of one tensor (every rank's of a gathered buffer) decode to
// exactly what decompress() of each in turn gives, from an overwrite or onto the output's values, and a corrupt
// payload throws CorruptPayload. (The CUDA path's batched decode: tests/gpu/codec_parity_gpu_test.cc.)
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

std::vector<std::vector<std::byte>> payloads_of(const std::string& spec, std::size_t n, int ranks) {
  std::vector<std::vector<std::byte>> payloads;
  for (int rank = 0; rank < ranks; ++rank) {
    std::mt19937 rng(static_cast<unsigned>(11 + rank));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    CompressContext ctx;
    ctx.name = "t";
    auto encoder = make_compressor(spec);
    payloads.push_back(compress_to_vector(*encoder, TensorView::of(std::span<const float>(values)), ctx));
  }
  return payloads;
}

class DecompressSum : public ::testing::TestWithParam<std::string> {};

TEST_P(DecompressSum, EqualsDecompressOfEachInTurn) {
  const std::size_t n = 4099;
  const auto payloads = payloads_of(GetParam(), n, 3);
  const std::vector<PayloadBytes> spans(payloads.begin(), payloads.end());  // host payloads
  for (const DecodeMode first : {DecodeMode::kOverwrite, DecodeMode::kAccumulate}) {
    auto compressor = make_compressor(GetParam());
    std::vector<float> expected(n, 0.5f), got(n, 0.5f);
    for (std::size_t r = 0; r < payloads.size(); ++r) {
      compressor->decompress(payloads[r], TensorView::of(std::span<float>(expected)),
                             r == 0 ? first : DecodeMode::kAccumulate);
    }
    compressor->decompress_sum(spans, TensorView::of(std::span<float>(got)), first);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0)
        << GetParam() << (first == DecodeMode::kOverwrite ? " overwrite" : " accumulate");
  }
}

TEST_P(DecompressSum, CorruptPayloadThrows) {
  const std::size_t n = 1000;
  const auto payloads = payloads_of(GetParam(), n, 2);
  std::vector<PayloadBytes> spans(payloads.begin(), payloads.end());
  spans[1].bytes = spans[1].bytes.first(spans[1].bytes.size() - 1);
  auto compressor = make_compressor(GetParam());
  std::vector<float> out(n);
  EXPECT_THROW(compressor->decompress_sum(spans, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite),
               CorruptPayload);
}

INSTANTIATE_TEST_SUITE_P(Codecs, DecompressSum,
                         ::testing::Values("none", "fp16", "qsgd", "onebit", "topk:k=5,values=f16", "randomk",
                                           "blocktopk:ratio=0.1,block=64", "dgc"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (const char c : info.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace gradcomp
