// One NaN on the wire (kernels/wire_nan.cuh): whatever NaN bits a gradient holds or the arithmetic produces (x86
// keeps an input NaN's sign and payload, a GPU returns 0x7FFFFFFF), a payload written under nonfinite=pass holds
// only 0x7FC00000 (f32), 0x7E00 (f16) or 0x7FC0 (bf16). The CPU half of the GPU parity of nonfinite=pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"
#include "gradcomp/registry.h"
#include "kernels/fp16_ops.cuh"
#include "compressors/codecs/half_cpu.h"
#include "kernels/sparsify_ops.cuh"
#include "kernels/wire_nan.cuh"
#include "tests/compressors/sparse_test_util.h"
#include "tests/gpu/parity_data.h"

namespace gradcomp {
namespace {

using kernels::bits_float;
using kernels::float_bits;

// NaNs as x86 and CUDA produce them: quiet with a payload, negative (x86's "indefinite", e.g. inf - inf),
// signalling, and the GPU's canonical 0x7FFFFFFF.
const std::vector<std::uint32_t> kNanBits = {0x7FC00000u, 0x7FC01234u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu,
                                             0xFFFFFFFFu};

TEST(WireNan, ElementFunctionsWriteOneNan) {
  for (const std::uint32_t bits : kNanBits) {
    const float nan = bits_float(bits);
    EXPECT_EQ(float_bits(kernels::wire_f32(nan)), kernels::kWireNanF32) << std::hex << bits;
    EXPECT_EQ(kernels::fp16_encode(nan), kernels::kWireNanF16) << std::hex << bits;
    EXPECT_EQ(kernels::bf16_encode(nan), kernels::kWireNanBF16) << std::hex << bits;
    bool saturated = true;
    EXPECT_EQ(kernels::sparse_value_to_half(nan, saturated), kernels::kWireNanF16) << std::hex << bits;
    EXPECT_FALSE(saturated);
  }
  for (const float value : {0.0f, -0.0f, 1.5f, -3e38f, INFINITY, -INFINITY}) {
    EXPECT_EQ(float_bits(kernels::wire_f32(value)), float_bits(value)) << value;
  }
  EXPECT_EQ(kernels::fp16_encode(-INFINITY), 0xFC00u);
  EXPECT_EQ(kernels::bf16_encode(INFINITY), 0x7F80u);
}

// The vectorized fp16 loop (F16C where built with it) agrees: a vector holding a NaN takes the scalar function.
TEST(WireNan, HalfEncodeLoopsWriteOneNan) {
  std::vector<float> values(64, 0.75f);
  for (std::size_t j = 0; j < kNanBits.size(); ++j) values[j * 9 + 1] = bits_float(kNanBits[j]);
  std::vector<std::uint16_t> f16(values.size()), bf16(values.size());
  kernels::half_encode_range<kernels::HalfFormat::kF16>(values.data(), nullptr, values.size(), 1.0f, f16.data());
  kernels::half_encode_range<kernels::HalfFormat::kBF16>(values.data(), nullptr, values.size(), 1.0f, bf16.data());
  for (std::size_t j = 0; j < kNanBits.size(); ++j) {
    EXPECT_EQ(f16[j * 9 + 1], kernels::kWireNanF16) << j;
    EXPECT_EQ(bf16[j * 9 + 1], kernels::kWireNanBF16) << j;
  }
}

struct NanScan {
  std::size_t nans = 0;
  std::size_t other_nans = 0;  // NaNs that are not the wire NaN
};

// NaNs in the value sections of a payload (the dense body, the quantizers' scales, the sparsifiers' values).
NanScan scan_payload(const std::vector<std::byte>& bytes) {
  const auto header = payload::peek_header(bytes);
  const auto view = payload::parse(bytes, header.codec);
  NanScan scan;
  auto f32 = [&](std::span<const std::byte> section) {
    for (std::size_t i = 0; i + 4 <= section.size(); i += 4) {
      std::uint32_t bits;
      std::memcpy(&bits, section.data() + i, 4);
      if ((bits & 0x7FFFFFFFu) > 0x7F800000u) ++(bits == kernels::kWireNanF32 ? scan.nans : scan.other_nans);
    }
  };
  auto half = [&](std::span<const std::byte> section, std::uint16_t exponent, std::uint16_t wire) {
    for (std::size_t i = 0; i + 2 <= section.size(); i += 2) {
      std::uint16_t bits;
      std::memcpy(&bits, section.data() + i, 2);
      if ((bits & exponent) == exponent && (bits & 0x7FFFu) != exponent) ++(bits == wire ? scan.nans : scan.other_nans);
    }
  };
  switch (header.codec) {
    case payload::CodecId::kNone: f32(view.sections[0]); break;
    case payload::CodecId::kFp16: half(view.sections[0], 0x7C00u, kernels::kWireNanF16); break;
    case payload::CodecId::kBf16: half(view.sections[0], 0x7F80u, kernels::kWireNanBF16); break;
    case payload::CodecId::kQsgd:
    case payload::CodecId::kTernGrad:
    case payload::CodecId::kOneBit: f32(view.sections[0]); break;
    case payload::CodecId::kTopK:
    case payload::CodecId::kDgc:
      if (header.param0 == 1) {
        half(view.sections[1], 0x7C00u, kernels::kWireNanF16);
      } else {
        f32(view.sections[1]);
      }
      break;
    default: f32(view.sections[1]); break;  // randomk, blocktopk: f32 values
  }
  return scan;
}

// Selection keys: every NaN is the one key 0x7FFFFFFF (above inf), so which NaN the arithmetic made (x86 or GPU)
// never decides what top-k or block top-k sends.
TEST(NanKeys, EveryNanIsOneKeyAboveInfinity) {
  const std::uint32_t inf_key = kernels::magnitude_key(INFINITY);
  for (const std::uint32_t bits : kNanBits) {
    const std::uint32_t key = kernels::magnitude_key(bits_float(bits));
    EXPECT_EQ(key, 0x7FFFFFFFu) << std::hex << bits;
    EXPECT_GT(key, inf_key);
    EXPECT_EQ(kernels::magnitude_key(bits_float(key)), key) << "a key's key is itself";
  }
  EXPECT_EQ(kernels::magnitude_key(-2.5f), kernels::magnitude_key(2.5f));
}

// Two NaN blocks (the later one's NaN has the larger payload) tie and the lower block id is sent: the block the GPU
// sends, where every NaN norm is 0x7FFFFFFF.
TEST(NanKeys, NanBlocksTieAndTheLowerBlockIsSent) {
  std::vector<float> grad(16, 0.5f);
  grad[5] = bits_float(0x7FC00000u);   // block 1
  grad[13] = bits_float(0xFFC01234u);  // block 3: |payload| larger
  auto codec = make_compressor("blocktopk:block=4,ratio=0.25,nonfinite=pass");
  EXPECT_EQ(testing::section_ints(testing::compress(*codec, grad, "b", 0), 0), std::vector<std::int32_t>{1});
  auto topk = make_compressor("topk:k=1,nonfinite=pass");
  EXPECT_EQ(testing::section_ints(testing::compress(*topk, grad, "t", 0), 0), std::vector<std::int32_t>{5});
}

class WireNanCodecs : public ::testing::TestWithParam<std::string> {};

// Every parity spec under nonfinite=pass, prescale 1 (a copy keeps the input's bits) and 0.5 (a product makes the
// machine's NaN): the payload holds NaN only as the wire NaN, and (except random-k, whose positions are drawn) holds
// at least one.
TEST_P(WireNanCodecs, PassWritesOnlyTheWireNan) {
  const std::string spec = parity::with_param(GetParam(), "nonfinite=pass");
  for (const float prescale : {1.0f, 0.5f}) {
    auto compressor = make_compressor(spec);
    auto values = parity::random_values(4099, 5);
    for (std::size_t j = 0; j < kNanBits.size(); ++j) values[100 + 601 * j] = bits_float(kNanBits[j]);
    CompressContext ctx;
    ctx.name = "nan";
    ctx.prescale = prescale;
    for (std::uint64_t step = 0; step < 2; ++step) {
      ctx.step = step;
      const auto payload = compress_to_vector(*compressor, TensorView::of(std::span<const float>(values)), ctx);
      EXPECT_EQ(compressor->last_stats().nonfinite, kNanBits.size());
      const NanScan scan = scan_payload(payload);
      EXPECT_EQ(scan.other_nans, 0u) << spec << " prescale " << prescale << " step " << step;
      if (GetParam().rfind("randomk", 0) != 0) {
        EXPECT_GT(scan.nans, 0u) << spec << " prescale " << prescale;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, WireNanCodecs, ::testing::ValuesIn(parity::specs()), [](const auto& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
});

}  // namespace
}  // namespace gradcomp
