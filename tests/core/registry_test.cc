#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

TEST(Registry, BuiltinsIncludeNone) {
  auto registry = Registry::with_builtins();
  ASSERT_TRUE(registry->contains("none"));
  const auto& info = registry->info("none");
  EXPECT_TRUE(info.traits.summable);
  EXPECT_FALSE(info.traits.lossy);
  EXPECT_TRUE(default_registry().contains("none"));
}

TEST(Registry, DuplicateAndBadNamesAreRejected) {
  Registry registry;
  CompressorInfo info;
  info.name = "mine";
  info.factory = [](const Params&) -> std::unique_ptr<Compressor> { return nullptr; };
  registry.add(info);
  EXPECT_THROW(registry.add(info), InvalidArgument);
  info.name = "Bad-Name";
  EXPECT_THROW(registry.add(info), InvalidArgument);
  info.name = "nofactory";
  info.factory = nullptr;
  EXPECT_THROW(registry.add(info), InvalidArgument);
}

TEST(Registry, OpenParamsReachTheFactoryAndRemoveForgetsTheKind) {
  Registry registry;
  CompressorInfo info;
  info.name = "open";
  info.open_params = true;
  std::string seen;
  info.factory = [&seen](const Params& params) -> std::unique_ptr<Compressor> {
    seen = params.canonical({});
    return make_compressor("none");
  };
  registry.add(info);
  const CompressorSpec spec = registry.parse("open:zeta=1,alpha=x");
  EXPECT_EQ(spec.canonical, "open:alpha=x,zeta=1");  // undeclared parameters, in key order
  EXPECT_TRUE(spec.params.given("zeta"));
  registry.create(spec);
  EXPECT_EQ(seen, "open:alpha=x,zeta=1");
  EXPECT_TRUE(registry.remove("open"));
  EXPECT_FALSE(registry.contains("open"));
  EXPECT_FALSE(registry.remove("open"));
  EXPECT_THROW(registry.parse("open"), InvalidArgument);
}

TEST(NoneCompressor, RoundTripsExactly) {
  auto none = make_compressor("none");
  EXPECT_EQ(none->spec(), "none:nonfinite=raise");
  std::vector<float> grad{1.5f, -2.25f, 0.0f, 3e-30f, 7e30f};
  const auto payload = compress_to_vector(*none, TensorView::of(std::span<float>(grad)), {.name = "w"});
  EXPECT_EQ(none->last_stats().payload_bytes, payload.size());
  std::vector<float> out(grad.size(), -1.0f);
  none->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  EXPECT_EQ(out, grad);
  none->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kAccumulate);
  for (std::size_t i = 0; i < grad.size(); ++i) EXPECT_EQ(out[i], 2 * grad[i]);
}

TEST(NoneCompressor, AppliesPrescale) {
  auto none = make_compressor("none");
  std::vector<float> grad{4.0f, -8.0f};
  const auto payload =
      compress_to_vector(*none, TensorView::of(std::span<float>(grad)), {.name = "w", .prescale = 0.25f});
  std::vector<float> out(2);
  none->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f}));
}

TEST(NoneCompressor, EmptyAndSingleElementTensors) {
  auto none = make_compressor("none");
  std::vector<float> empty;
  const auto payload = compress_to_vector(*none, TensorView::of(std::span<float>(empty)), {.name = "e"});
  std::vector<float> out;
  EXPECT_NO_THROW(none->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite));
  std::vector<float> one{3.0f}, one_out{0.0f};
  const auto payload1 = compress_to_vector(*none, TensorView::of(std::span<float>(one)), {.name = "o"});
  none->decompress(payload1, TensorView::of(std::span<float>(one_out)), DecodeMode::kOverwrite);
  EXPECT_EQ(one_out[0], 3.0f);
}

TEST(NoneCompressor, NonFinitePolicyRaiseNamesTensorAndRank) {
  auto none = make_compressor("none");
  std::vector<float> grad{1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  try {
    compress_to_vector(*none, TensorView::of(std::span<float>(grad)), {.name = "fc.weight", .rank = 3});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("fc.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 3"), std::string::npos) << message;
    EXPECT_NE(message.find("index 1"), std::string::npos) << message;
  }
}

TEST(NoneCompressor, NonFinitePolicySkipSendsZeros) {
  auto none = make_compressor("none:nonfinite=skip");
  std::vector<float> grad{1.0f, std::numeric_limits<float>::infinity()};
  const auto payload = compress_to_vector(*none, TensorView::of(std::span<float>(grad)), {.name = "w"});
  EXPECT_TRUE(none->last_stats().skipped);
  EXPECT_EQ(none->last_stats().nonfinite, 1u);
  std::vector<float> out(2, 5.0f);
  none->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f}));
}

TEST(NoneCompressor, RejectsSmallBufferAndWrongDtype) {
  auto none = make_compressor("none");
  std::vector<float> grad(10);
  std::vector<std::byte> small(16);
  EXPECT_THROW(none->compress(TensorView::of(std::span<float>(grad)), small, {.name = "w"}), InvalidArgument);
  std::vector<std::int32_t> ints(4);
  std::vector<std::byte> out(1024);
  EXPECT_THROW(none->compress(TensorView(ints.data(), 4, DType::kI32), out, {.name = "w"}), InvalidArgument);
  EXPECT_THROW(none->compress(TensorView::of(std::span<float>(grad)), out, {.name = ""}), InvalidArgument);
}

TEST(NoneCompressor, DecodeRejectsCorruptPayloadWithoutTouchingOutput) {
  auto none = make_compressor("none");
  std::vector<float> grad{1, 2, 3, 4};
  auto payload = compress_to_vector(*none, TensorView::of(std::span<float>(grad)), {.name = "w"});
  std::vector<float> out(4, 9.0f);
  auto truncated = payload;
  truncated.pop_back();
  EXPECT_THROW(none->decompress(truncated, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite),
               CorruptPayload);
  std::vector<float> wrong_size(5);
  EXPECT_THROW(none->decompress(payload, TensorView::of(std::span<float>(wrong_size)), DecodeMode::kOverwrite),
               CorruptPayload);
  EXPECT_EQ(out, (std::vector<float>(4, 9.0f)));
}

TEST(NoneCompressor, StateOfAnotherCodecIsRejected) {
  auto none = make_compressor("none");
  const auto state = none->save_state();
  EXPECT_NO_THROW(none->load_state(state));
  auto garbage = state;
  garbage[0] = std::byte{0};
  EXPECT_THROW(none->load_state(garbage), CorruptPayload);
}

}  // namespace
}  // namespace gradcomp
