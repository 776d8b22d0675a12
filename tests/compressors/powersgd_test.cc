// The powersgd codec on one rank: compress()/decompress() against the independent reference, low-rank exactness,
// error-feedback conservation, shapes that travel uncompressed, bad input, state round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/half_ops.cuh"
#include "tests/compressors/powersgd_reference.h"

namespace gradcomp {
namespace {

std::vector<float> random_matrix(std::size_t numel, std::uint64_t salt) {
  std::vector<float> values(numel);
  std::uint64_t state = 0x9E3779B97F4A7C15ull ^ salt;
  for (float& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5);
  }
  return values;
}

CompressContext context(std::string_view name, std::uint64_t step) {
  CompressContext ctx;
  ctx.name = name;
  ctx.step = step;
  return ctx;
}

std::vector<float> round_trip(Compressor& codec, std::vector<float>& grad, std::size_t rows, std::string_view name,
                              std::uint64_t step) {
  const TensorView view = TensorView::of(std::span<float>(grad)).with_rows(rows);
  std::vector<std::byte> payload(codec.max_payload_bytes(grad.size()));
  payload.resize(codec.compress(view, payload, context(name, step)));
  std::vector<float> out(grad.size());
  codec.decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  return out;
}

// The residual kept for `name`, read from save_state() (buffers[0] of its record).
std::vector<float> residual_of(const Compressor& codec, std::string_view name) {
  const auto bytes = codec.save_state();
  ByteReader reader(bytes, "test");
  const auto count = read_state_envelope(reader, "powersgd");
  for (std::uint64_t t = 0; t < count; ++t) {
    StateRecord record = read_state_record(reader);
    if (record.name == name) return record.buffers.at(0);
  }
  return {};
}

TEST(PowerSgd, MatchesReferenceOverStepsWithWarmStartAndErrorFeedback) {
  for (std::size_t rank : {1u, 2u, 4u}) {
    auto codec = make_compressor(fmt::format("powersgd:rank={}", rank));
    testing::PowerSgdReference ref("w", 48, 80, rank, 1);
    for (std::uint64_t step = 0; step < 4; ++step) {
      auto grad = random_matrix(48 * 80, step);
      const auto expected = ref.step({grad}, step);
      const auto out = round_trip(*codec, grad, 48, "w", step);
      EXPECT_LT(testing::relative_error(out, expected), 2e-5) << "rank " << rank << " step " << step;
      const auto residual = residual_of(*codec, "w");
      std::vector<float> residual_f(residual.begin(), residual.end());
      EXPECT_LT(testing::relative_error(residual_f, ref.residual(0)), 2e-5) << "rank " << rank << " step " << step;
    }
  }
}

TEST(PowerSgd, RecoversAnExactlyLowRankMatrix) {
  const std::size_t rows = 64, cols = 96;
  const auto u = random_matrix(rows, 1), v = random_matrix(cols, 2);
  std::vector<float> grad(rows * cols);
  for (std::size_t a = 0; a < rows; ++a) {
    for (std::size_t b = 0; b < cols; ++b) grad[a * cols + b] = u[a] * v[b];
  }
  auto codec = make_compressor("powersgd:rank=1,ef=off");
  auto copy = grad;
  const auto out = round_trip(*codec, copy, rows, "uv", 0);
  std::vector<double> exact(grad.begin(), grad.end());
  EXPECT_LT(testing::relative_error(out, exact), 1e-5);
}

TEST(PowerSgd, ErrorFeedbackConservesTheGradientSum) {
  auto codec = make_compressor("powersgd:rank=2");
  std::vector<double> sent(32 * 40, 0.0), given(32 * 40, 0.0);
  for (std::uint64_t step = 0; step < 5; ++step) {
    auto grad = random_matrix(32 * 40, 100 + step);
    for (std::size_t i = 0; i < grad.size(); ++i) given[i] += grad[i];
    const auto out = round_trip(*codec, grad, 32, "c", step);
    for (std::size_t i = 0; i < out.size(); ++i) sent[i] += out[i];
  }
  const auto residual = residual_of(*codec, "c");
  ASSERT_EQ(residual.size(), given.size());
  for (std::size_t i = 0; i < given.size(); ++i) EXPECT_NEAR(sent[i] + residual[i], given[i], 2e-5) << i;
}

TEST(PowerSgd, VectorsAndMatricesThatWouldNotShrinkTravelExactly) {
  auto codec = make_compressor("powersgd:rank=4");
  auto bias = random_matrix(100, 3);
  EXPECT_EQ(round_trip(*codec, bias, 0, "bias", 0), bias);
  auto thin = random_matrix(1 * 128, 4);  // (1, 128): rank 4 * 129 * 2 > 128
  EXPECT_EQ(round_trip(*codec, thin, 1, "thin", 0), thin);
  auto small = random_matrix(10 * 12, 5);  // 4 * 22 * 2 = 176 > 120
  EXPECT_EQ(round_trip(*codec, small, 10, "small", 0), small);
  EXPECT_TRUE(residual_of(*codec, "small").empty());
}

// What cost models price a call at (the hierarchical auto mode): a compressed matrix's payload, within its section
// padding; a vector or a matrix that would not shrink travels dense. Never the bound (twice the tensor).
TEST(PowerSgd, ExpectedPayloadIsWhatCompressWritesForTheShape) {
  auto codec = make_compressor("powersgd:rank=4");
  auto grad = random_matrix(64 * 48, 6);
  const TensorView view = TensorView::of(std::span<float>(grad)).with_rows(64);
  std::vector<std::byte> payload(codec->max_payload_bytes(grad.size()));
  const std::size_t written = codec->compress(view, payload, context("w", 0));
  const std::size_t expected = codec->expected_payload_bytes(grad.size(), 64);
  EXPECT_GE(expected + 3 * 64, written);
  EXPECT_LE(expected, written + 3 * 64);
  EXPECT_LT(expected, 4 * grad.size());
  EXPECT_GE(codec->expected_payload_bytes(100, 0), 4 * 100u);      // a vector
  EXPECT_GE(codec->expected_payload_bytes(10 * 12, 10), 4 * 120u);  // 4 * 22 * 2 > 120: dense
  EXPECT_GE(codec->expected_payload_bytes(4 * 100, 4), 4 * 400u);   // rank 4 is not below 4 rows: compress() refuses
  EXPECT_LT(codec->expected_payload_bytes(40'000ull * 32'500, 40'000), std::size_t{2} << 20);  // 1.16 MB of factors
}

TEST(PowerSgd, StartStepSendsDenseBeforeIt) {
  auto codec = make_compressor("powersgd:rank=1,start_step=2");
  auto grad = random_matrix(32 * 32, 6);
  EXPECT_EQ(round_trip(*codec, grad, 32, "w", 1), grad);
  EXPECT_NE(round_trip(*codec, grad, 32, "w", 2), grad);
}

TEST(PowerSgd, RankNotBelowTheSmallerDimensionRaisesNamingTheTensor) {
  for (const char* spec : {"powersgd:rank=8", "powersgd:rank=8,min_compression_rate=0", "powersgd:rank=4"}) {
    auto codec = make_compressor(spec);
    auto grad = random_matrix(4 * 100, 7);
    try {
      round_trip(*codec, grad, 4, "layer3.weight", 0);
      FAIL() << spec << ": expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("layer3.weight"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("4x100"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(codec->save_state().size() < 64) << spec << ": no state kept for a refused tensor";
  }
  // Also before start_step, when nothing is compressed yet: the shape is checked on every step.
  auto late = make_compressor("powersgd:rank=8,start_step=100");
  auto grad = random_matrix(4 * 100, 7);
  EXPECT_THROW(round_trip(*late, grad, 4, "w", 0), InvalidArgument);
  // 1 x n and n x 1 matrices are vectors: uncompressed at any rank.
  auto codec = make_compressor("powersgd:rank=8");
  auto row = random_matrix(128, 8);
  EXPECT_EQ(round_trip(*codec, row, 1, "head.weight", 0), row);
  EXPECT_EQ(round_trip(*codec, row, 128, "column", 0), row);
}

TEST(PowerSgd, NonFinitePolicies) {
  auto grad = random_matrix(16 * 24, 8);
  auto bad = grad;
  bad[37] = std::numeric_limits<float>::quiet_NaN();
  {
    auto codec = make_compressor("powersgd:rank=2");
    round_trip(*codec, grad, 16, "w", 0);
    const auto before = codec->save_state();
    try {
      round_trip(*codec, bad, 16, "w", 1);
      FAIL() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the first at index 37"), std::string::npos) << e.what();
    }
    EXPECT_EQ(codec->save_state(), before);
  }
  {
    // skip: this rank contributes zeros and keeps its residual; the shared Q still advances like every rank's.
    auto codec = make_compressor("powersgd:rank=2,nonfinite=skip");
    round_trip(*codec, grad, 16, "w", 0);
    const auto residual = residual_of(*codec, "w");
    const auto out = round_trip(*codec, bad, 16, "w", 1);
    for (float v : out) EXPECT_EQ(v, 0.0f);
    EXPECT_EQ(residual_of(*codec, "w"), residual);
  }
  {
    auto codec = make_compressor("powersgd:rank=2,nonfinite=pass");
    round_trip(*codec, bad, 16, "w", 0);
    for (float v : residual_of(*codec, "w")) EXPECT_TRUE(std::isfinite(v));
    auto next = random_matrix(16 * 24, 9);
    for (float v : round_trip(*codec, next, 16, "w", 1)) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(PowerSgd, StateRoundTripGivesTheSameNextStep) {
  auto a = make_compressor("powersgd:rank=2");
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto grad = random_matrix(24 * 40, 20 + step);
    round_trip(*a, grad, 24, "w", step);
  }
  auto b = make_compressor("powersgd");  // rank 1 spelled differently: another Q shape, drawn afresh on load
  auto c = make_compressor("powersgd:rank=2,warm_start=on");
  c->load_state(a->save_state());
  EXPECT_EQ(c->save_state(), a->save_state());
  auto grad = random_matrix(24 * 40, 30);
  auto grad2 = grad;
  EXPECT_EQ(round_trip(*a, grad, 24, "w", 3), round_trip(*c, grad2, 24, "w", 3));
  b->load_state(a->save_state());
  EXPECT_THROW(make_compressor("topk")->load_state(a->save_state()), InvalidArgument);
  auto state = a->save_state();
  state.resize(state.size() - 3);
  EXPECT_THROW(c->load_state(state), CorruptPayload);
}

TEST(PowerSgd, EquivalentSpellingsAreOneSpec) {
  EXPECT_EQ(make_compressor("powersgd")->spec(), make_compressor("powersgd:rank=1,warm_start=true")->spec());
  EXPECT_THROW(make_compressor("powersgd:rank=0"), InvalidArgument);
  EXPECT_THROW(make_compressor("powersgd:rnk=2"), InvalidArgument);
  EXPECT_TRUE(make_compressor("powersgd")->traits().rounds);
}

TEST(PowerSgd, CorruptPayloadsAreRefusedAndLeaveTheOutputUntouched) {
  auto codec = make_compressor("powersgd:rank=2");
  auto grad = random_matrix(20 * 30 + 7, 10);
  std::vector<TensorSegment> segments = {{"w", 0, 600, 0, 0, 20}, {"b", 600, 7, 0, 0, 0}};
  CompressContext ctx = context("bucket", 0);
  ctx.segments = segments;
  std::vector<std::byte> payload(codec->max_payload_bytes(grad.size()));
  payload.resize(codec->compress(TensorView::of(std::span<float>(grad)), payload, ctx));
  std::vector<float> out(grad.size(), 7.0f);
  const TensorView view = TensorView::of(std::span<float>(out));
  auto truncated = payload;
  truncated.resize(truncated.size() - 16);
  EXPECT_THROW(codec->decompress(truncated, view, DecodeMode::kOverwrite), CorruptPayload);
  auto bad_rows = payload;
  bad_rows[64 + 16] = std::byte{7};  // block 0's rows: 7 does not divide 600
  EXPECT_THROW(codec->decompress(bad_rows, view, DecodeMode::kOverwrite), CorruptPayload);
  for (float v : out) EXPECT_EQ(v, 7.0f);
  codec->decompress(payload, view, DecodeMode::kOverwrite);
  for (std::size_t i = 600; i < out.size(); ++i) EXPECT_EQ(out[i], grad[i]);  // the vector travels exactly
}

TEST(PowerSgd, HalfPrecisionTensors) {
  auto codec = make_compressor("powersgd:rank=1,ef=off");
  const std::size_t rows = 32, cols = 48;
  const auto u = random_matrix(rows, 11), v = random_matrix(cols, 12);
  std::vector<std::uint16_t> half(rows * cols);
  std::vector<double> exact(rows * cols);
  for (std::size_t a = 0; a < rows; ++a) {
    for (std::size_t b = 0; b < cols; ++b) {
      half[a * cols + b] = kernels::float_to_bf16_bits(u[a] * v[b]);
      exact[a * cols + b] = kernels::bf16_bits_to_float(half[a * cols + b]);
    }
  }
  const TensorView view = TensorView(half.data(), half.size(), DType::kBF16).with_rows(rows);
  std::vector<std::byte> payload(codec->max_payload_bytes(half.size()));
  payload.resize(codec->compress(view, payload, context("h", 0)));
  std::vector<float> out(half.size());
  codec->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  EXPECT_LT(testing::relative_error(out, exact), 1e-2);  // bf16 inputs are rank 1 only to 8 bits
}

}  // namespace
}  // namespace gradcomp
