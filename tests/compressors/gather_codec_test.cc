// GatherCodec (compressors/framework/gather_codec.h): a summable codec encodes a tensor made of parts from the parts
// and decodes into them, bit for bit what compress()/decompress() of the laid-out tensor give, with the same state
// and the same non-finite handling; corrupt payloads and mismatched parts are refused before anything is written;
// other codecs do not offer it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "gradcomp/error.h"
#include "sparse_test_util.h"

namespace gradcomp::testing {
namespace {

const std::vector<std::size_t> kPartSizes = {5, 1000, 3, 4097};
const char* const kNames[] = {"a", "b", "c", "d"};

std::vector<TensorSegment> segments_of(std::uint64_t step) {
  std::vector<TensorSegment> segments;
  std::size_t offset = 0;
  for (std::size_t p = 0; p < kPartSizes.size(); ++p) {
    segments.push_back(TensorSegment{kNames[p], offset, kPartSizes[p], 0, kPartSizes[p], 0, step + p});
    offset += kPartSizes[p];
  }
  return segments;
}

GatherCodec& gather_of(Compressor& c) {
  auto* gather = dynamic_cast<GatherCodec*>(&c);
  EXPECT_NE(gather, nullptr);
  return *gather;
}

// The parts of `laid` (a copy of it cut at kPartSizes), as views.
struct Parts {
  explicit Parts(const std::vector<float>& laid) {
    std::size_t offset = 0;
    for (std::size_t size : kPartSizes) {
      storage.emplace_back(laid.begin() + static_cast<std::ptrdiff_t>(offset),
                           laid.begin() + static_cast<std::ptrdiff_t>(offset + size));
      offset += size;
    }
    for (auto& part : storage) views.push_back(TensorView::of(std::span<float>(part)));
  }
  std::vector<float> joined() const {
    std::vector<float> out;
    for (const auto& part : storage) out.insert(out.end(), part.begin(), part.end());
    return out;
  }
  std::vector<std::vector<float>> storage;
  std::vector<TensorView> views;
};

std::size_t total() {
  std::size_t n = 0;
  for (std::size_t size : kPartSizes) n += size;
  return n;
}

TEST(GatherCodec, PartsGiveTheLaidOutTensorsBitsAndState) {
  for (const char* spec : {"none", "fp16", "bf16", "fp16:ef=off", "bf16:ef=off,nonfinite=pass"}) {
    SCOPED_TRACE(spec);
    auto laid_codec = make_compressor(spec);
    auto parts_codec = make_compressor(spec);
    ASSERT_TRUE(gather_of(*parts_codec).gathers());
    for (std::uint64_t step = 0; step < 3; ++step) {
      std::vector<float> grad = make_values(total(), 40 + step);
      const auto segments = segments_of(step);
      CompressContext ctx;
      ctx.name = "fused";
      ctx.segments = segments;
      ctx.world_size = 4;
      ctx.prescale = 0.25f;
      std::vector<std::byte> a(laid_codec->payload_bound(grad.size(), segments));
      std::vector<std::byte> b(a.size());
      const std::size_t size_a = laid_codec->compress(TensorView::of(std::span<float>(grad)), a, ctx);
      Parts parts(grad);
      const std::size_t size_b = gather_of(*parts_codec).compress_parts(parts.views, b, ctx);
      ASSERT_EQ(size_a, size_b);
      a.resize(size_a);
      b.resize(size_b);
      ASSERT_EQ(a, b) << "step " << step;
      for (DecodeMode mode : {DecodeMode::kOverwrite, DecodeMode::kAccumulate}) {
        std::vector<float> out = make_values(total(), 90 + step);
        Parts out_parts(out);
        laid_codec->decompress(a, TensorView::of(std::span<float>(out)), mode);
        gather_of(*parts_codec).decompress_parts(b, out_parts.views, mode);
        ASSERT_EQ(bits_of(out_parts.joined()), bits_of(out)) << "step " << step;
      }
    }
    EXPECT_EQ(laid_codec->save_state(), parts_codec->save_state());
  }
}

TEST(GatherCodec, HalfPrecisionPartsAreConvertedLikeTheLaidOutTensor) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    auto laid_codec = make_compressor("none");
    auto parts_codec = make_compressor("none");
    std::vector<std::uint16_t> laid(total());
    for (std::size_t i = 0; i < laid.size(); ++i) laid[i] = static_cast<std::uint16_t>(0x3c00 + (i * 37) % 900);
    std::vector<std::vector<std::uint16_t>> parts;
    std::vector<TensorView> views;
    std::size_t offset = 0;
    for (std::size_t size : kPartSizes) {
      parts.emplace_back(laid.begin() + static_cast<std::ptrdiff_t>(offset),
                         laid.begin() + static_cast<std::ptrdiff_t>(offset + size));
      offset += size;
    }
    for (auto& part : parts) views.emplace_back(part.data(), part.size(), dtype);
    const auto segments = segments_of(0);
    CompressContext ctx;
    ctx.name = "fused";
    ctx.segments = segments;
    std::vector<std::byte> a(laid_codec->payload_bound(laid.size(), segments)), b(a.size());
    a.resize(laid_codec->compress(TensorView(laid.data(), laid.size(), dtype), a, ctx));
    b.resize(gather_of(*parts_codec).compress_parts(views, b, ctx));
    ASSERT_EQ(a, b);
    // Accumulating into half-precision outputs: each part, and the laid-out copy, start from `laid`.
    std::vector<std::uint16_t> expected = laid;
    laid_codec->decompress(a, TensorView(expected.data(), expected.size(), dtype), DecodeMode::kAccumulate);
    gather_of(*parts_codec).decompress_parts(b, views, DecodeMode::kAccumulate);
    std::vector<std::uint16_t> joined;
    for (const auto& part : parts) joined.insert(joined.end(), part.begin(), part.end());
    EXPECT_EQ(joined, expected);
  }
}

TEST(GatherCodec, RaiseCorruptionAndMismatchChangeNothing) {
  auto codec = make_compressor("fp16");  // ef=on, nonfinite=raise
  GatherCodec& gather = gather_of(*codec);
  const auto segments = segments_of(0);
  CompressContext ctx;
  ctx.name = "fused";
  ctx.segments = segments;
  std::vector<float> grad = make_values(total(), 7);
  Parts parts(grad);
  std::vector<std::byte> payload(codec->payload_bound(grad.size(), segments));
  payload.resize(gather.compress_parts(parts.views, payload, ctx));
  const std::vector<std::byte> state = codec->save_state();

  parts.storage[2][1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> out(payload.size() + 64);
  try {
    gather.compress_parts(parts.views, out, ctx);
    FAIL() << "a NaN under nonfinite=raise must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'c' (carried in 'fused')"), std::string::npos) << e.what();
  }
  EXPECT_EQ(codec->save_state(), state) << "no part's residual moved";

  std::vector<TensorView> three(parts.views.begin(), parts.views.begin() + 3);
  EXPECT_THROW(gather.compress_parts(three, out, ctx), InvalidArgument);  // 3 parts, 4 segments
  EXPECT_EQ(codec->save_state(), state);

  std::vector<float> out_values(total(), 1.5f);
  Parts out_parts(out_values);
  const std::vector<std::byte> truncated(payload.begin(), payload.end() - 2);
  EXPECT_THROW(gather.decompress_parts(truncated, out_parts.views, DecodeMode::kOverwrite), CorruptPayload);
  EXPECT_EQ(out_parts.joined(), out_values) << "no part written";
}

TEST(GatherCodec, OnlySummableCodecsGather) {
  for (const char* spec : {"topk:ratio=0.1", "qsgd", "onebit", "powersgd:rank=2"}) {
    auto codec = make_compressor(spec);
    auto* gather = dynamic_cast<GatherCodec*>(codec.get());
    if (gather == nullptr) continue;  // a codec outside the error-feedback framework
    EXPECT_FALSE(gather->gathers()) << spec;
    std::vector<float> grad = make_values(total(), 3);
    Parts parts(grad);
    const auto segments = segments_of(0);
    CompressContext ctx;
    ctx.name = "fused";
    ctx.segments = segments;
    std::vector<std::byte> out(codec->payload_bound(grad.size(), segments));
    EXPECT_THROW(gather->compress_parts(parts.views, out, ctx), InvalidArgument) << spec;
  }
}

}  // namespace
}  // namespace gradcomp::testing
