// Checks every quantizing codec must pass (error-feedback invariant, thread-count determinism, state save/load
// bit-identity, corrupt payloads, 0/1-element tensors, non-finite policies). Each <codec>_test.cc instantiates
// QuantizerChecks with its specs. Header-only: every test file is its own executable.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/payload.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp::testing {

inline std::vector<float> normal_values(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> values(n);
  for (auto& v : values) v = dist(rng);
  return values;
}

inline std::unique_ptr<ErrorFeedbackCompressor> make_codec(const std::string& spec) {
  auto compressor = make_compressor(spec);
  auto* ef = dynamic_cast<ErrorFeedbackCompressor*>(compressor.get());
  EXPECT_NE(ef, nullptr) << spec;
  compressor.release();
  return std::unique_ptr<ErrorFeedbackCompressor>(ef);
}

inline std::vector<std::byte> compress(Compressor& codec, const std::vector<float>& grad, std::uint64_t step,
                                       const std::string& name = "layer.weight", float prescale = 1.0f) {
  CompressContext ctx{.name = name, .step = step};
  ctx.prescale = prescale;
  return compress_to_vector(codec, TensorView::of(std::span<const float>(grad)), ctx);
}

inline std::vector<float> decode(Compressor& codec, std::span<const std::byte> payload, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  codec.decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  return out;
}

inline std::vector<float> residual_of(const ErrorFeedbackCompressor& codec, const std::string& name, std::size_t n) {
  const TensorState* state = codec.state_of(name);
  if (!state || state->buffers.empty() || state->buffers[0].empty()) return std::vector<float>(n, 0.0f);
  return state->buffers[0];
}

// `spec` with one more parameter.
inline std::string with_param(const std::string& spec, const std::string& param) {
  return fmt::format("{}{}{}", spec, spec.find(':') == std::string::npos ? ":" : ",", param);
}

// Value of integer-or-float parameter `key` spelled in `spec`, or `fallback`.
inline double spec_value(const std::string& spec, const std::string& key, double fallback) {
  const auto at = spec.find(fmt::format("{}=", key));
  return at == std::string::npos ? fallback : std::stod(spec.substr(at + key.size() + 1));
}

class QuantizerChecks : public ::testing::TestWithParam<std::string> {};

// residual_after + transmitted == residual_before + grad, within the rounding of the f32 operations involved.
TEST_P(QuantizerChecks, ErrorFeedbackInvariant) {
  auto codec = make_codec(GetParam());
  if (!codec->error_feedback()) {  // ef=off keeps no residual at all
    compress(*codec, normal_values(100, 1), 0);
    ASSERT_NE(codec->state_of("layer.weight"), nullptr);
    EXPECT_TRUE(codec->state_of("layer.weight")->buffers[0].empty()) << GetParam();
    return;
  }
  // The payload is in the prescaled domain (fp16:prescale=...), the residual in the gradient's.
  const double prescale = spec_value(GetParam(), "prescale", 1.0);
  const std::size_t n = 5000;  // several buckets and a partial last one
  for (std::uint64_t step = 0; step < 4; ++step) {
    const auto grad = normal_values(n, 100 + static_cast<std::uint32_t>(step));
    const auto before = residual_of(*codec, "layer.weight", n);
    const auto payload = compress(*codec, grad, step);
    const auto sent = decode(*codec, payload, n);
    const auto after = residual_of(*codec, "layer.weight", n);
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double lhs = static_cast<double>(after[i]) + sent[i] / prescale;
      const double rhs = static_cast<double>(before[i]) + grad[i];
      const double scale =
          std::fabs(after[i]) + std::fabs(sent[i] / prescale) + std::fabs(before[i]) + std::fabs(grad[i]);
      worst = std::max(worst, std::fabs(lhs - rhs) / (scale + 1e-30));
      ASSERT_LE(std::fabs(lhs - rhs), 4.0 * 0x1p-24 * scale) << GetParam() << " step " << step << " index " << i;
    }
    // The residual is what the codec dropped: it must not be the whole gradient (something was sent).
    double sent2 = 0.0;
    for (float s : sent) sent2 += static_cast<double>(s) * s;
    EXPECT_GT(sent2, 0.0) << GetParam();
  }
}

TEST_P(QuantizerChecks, IdenticalBytesForAnyThreadCount) {
  const std::size_t n = 300'000;  // several 64K chunks
  const auto grad = normal_values(n, 7);
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::vector<float>> residuals;
  for (int threads : {1, 4, 3}) {
    auto codec = make_codec(GetParam());
    codec->set_threads(threads);
    std::vector<std::byte> last;
    for (std::uint64_t step = 0; step < 2; ++step) last = compress(*codec, grad, step);
    payloads.push_back(last);
    residuals.push_back(residual_of(*codec, "layer.weight", n));
    const auto decoded = decode(*codec, last, n);
    if (threads != 1) {
      auto serial = make_codec(GetParam());
      serial->set_threads(1);
      EXPECT_EQ(decoded, decode(*serial, last, n)) << "decode differs with " << threads << " threads";
    }
  }
  EXPECT_EQ(payloads[0], payloads[1]);
  EXPECT_EQ(payloads[0], payloads[2]);
  EXPECT_EQ(residuals[0], residuals[1]);
  EXPECT_EQ(residuals[0], residuals[2]);
}

TEST_P(QuantizerChecks, SaveLoadGivesBitIdenticalNextSteps) {
  const std::size_t n = 3000;
  auto grad_at = [&](std::uint64_t step) { return normal_values(n, 50 + static_cast<std::uint32_t>(step)); };
  auto original = make_codec(GetParam());
  for (std::uint64_t step = 0; step < 3; ++step) compress(*original, grad_at(step), step);
  const auto saved = original->save_state();
  auto restored = make_codec(GetParam());
  restored->load_state(saved);
  for (std::uint64_t step = 3; step < 5; ++step) {
    const auto a = compress(*original, grad_at(step), step);
    const auto b = compress(*restored, grad_at(step), step);
    ASSERT_EQ(a, b) << GetParam() << " step " << step;
  }
  EXPECT_EQ(original->save_state(), restored->save_state());
  // A fresh compressor (no residual) gives another payload at step 3 when error feedback is on.
  if (original->error_feedback()) {
    auto fresh = make_codec(GetParam());
    auto again = make_codec(GetParam());
    again->load_state(saved);
    EXPECT_NE(compress(*fresh, grad_at(3), 3), compress(*again, grad_at(3), 3));
  }
}

TEST_P(QuantizerChecks, ZeroAndOneElementTensors) {
  auto codec = make_codec(GetParam());
  const std::vector<float> empty;
  const auto p0 = compress(*codec, empty, 0, "empty");
  EXPECT_EQ(p0.size(), codec->max_payload_bytes(0));
  EXPECT_TRUE(decode(*codec, p0, 0).empty());
  const float prescale = static_cast<float>(spec_value(GetParam(), "prescale", 1.0));
  for (float value : {0.75f, -3.0f, 0.0f}) {
    auto one = make_codec(GetParam());
    const std::vector<float> grad{value};
    const auto p1 = compress(*one, grad, 0, "one");
    std::vector<float> out = decode(*one, p1, 1);
    out[0] /= prescale;
    // A single value is its own bucket scale: every codec here transmits it exactly (within rounding for fp16/bf16).
    EXPECT_NEAR(out[0], value, std::fabs(value) * 0x1p-8) << GetParam();
    if (one->error_feedback()) {
      const auto r = residual_of(*one, "one", 1);
      EXPECT_NEAR(r[0] + out[0], value, std::fabs(value) * 0x1p-20) << GetParam();
    }
  }
}

TEST_P(QuantizerChecks, CorruptPayloadsAreRejectedAndOutputUntouched) {
  auto codec = make_codec(GetParam());
  const std::size_t n = 1000;
  const auto grad = normal_values(n, 3);
  const auto good = compress(*codec, grad, 0);
  ASSERT_NO_THROW(decode(*codec, good, n));
  const std::vector<float> sentinel(n, 12345.0f);
  auto expect_rejected = [&](std::span<const std::byte> bytes, const std::string& what) {
    std::vector<float> out = sentinel;
    EXPECT_THROW(codec->decompress(bytes, TensorView::of(std::span<float>(out)), DecodeMode::kAccumulate),
                 CorruptPayload)
        << GetParam() << ": " << what;
    EXPECT_EQ(out, sentinel) << GetParam() << ": output written by a rejected decode (" << what << ")";
  };
  for (std::size_t length = 0; length < good.size(); ++length) {
    expect_rejected(std::span(good).first(length), fmt::format("truncated to {}", length));
  }
  auto longer = good;
  longer.push_back(std::byte{0});
  expect_rejected(longer, "one byte appended");
  for (std::size_t offset = 0; offset < payload::kHeaderBytes; ++offset) {
    if (offset >= 20 && offset < 24) continue;  // reserved bytes the foundation's parser ignores
    auto bad = good;
    bad[offset] ^= std::byte{0xFF};
    expect_rejected(bad, fmt::format("header byte {} flipped", offset));
  }
  // The wrong element count for the output tensor.
  std::vector<float> other(n + 1, 0.0f);
  EXPECT_THROW(codec->decompress(good, TensorView::of(std::span<float>(other)), DecodeMode::kOverwrite),
               CorruptPayload);
}

TEST_P(QuantizerChecks, NonFinitePolicies) {
  const std::size_t n = 4000;
  auto grad = normal_values(n, 11);
  const auto clean = grad;
  grad[700] = std::numeric_limits<float>::quiet_NaN();
  grad[1500] = -std::numeric_limits<float>::infinity();

  {  // raise (default): InvalidArgument naming the tensor; state untouched
    auto codec = make_codec(with_param(GetParam(), "nonfinite=raise"));
    compress(*codec, clean, 0);
    const auto before = codec->save_state();
    try {
      compress(*codec, grad, 1);
      ADD_FAILURE() << "no exception for NaN under nonfinite=raise";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("layer.weight"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("700"), std::string::npos) << error.what();
    }
    EXPECT_EQ(codec->save_state(), before);
  }
  {  // skip: zeros transmitted, state untouched
    auto codec = make_codec(with_param(GetParam(), "nonfinite=skip"));
    compress(*codec, clean, 0);
    const auto before = codec->save_state();
    const auto payload = compress(*codec, grad, 1);
    EXPECT_TRUE(codec->last_stats().skipped);
    EXPECT_EQ(codec->last_stats().nonfinite, 2u);
    for (float v : decode(*codec, payload, n)) ASSERT_EQ(v, 0.0f);
    EXPECT_EQ(codec->save_state(), before);
  }
  {  // pass: the non-finite values reach the output (so an AMP overflow check sees them); residuals stay finite
    auto codec = make_codec(with_param(GetParam(), "nonfinite=pass"));
    compress(*codec, clean, 0);
    const auto payload = compress(*codec, grad, 1);
    const auto out = decode(*codec, payload, n);
    EXPECT_FALSE(std::isfinite(out[700]));
    EXPECT_FALSE(std::isfinite(out[1500]));
    std::size_t finite = 0;
    for (float v : out) finite += std::isfinite(v);
    // Only the buckets holding a non-finite value decode to NaN (whole-tensor or 4096-value buckets cover all).
    const double bucket = spec_value(GetParam(), "bucket", 512.0);
    if (bucket > 0 && bucket <= 512) {
      EXPECT_GE(finite, n - 2 * static_cast<std::size_t>(bucket)) << GetParam();
    }
    for (float v : residual_of(*codec, "layer.weight", n)) ASSERT_TRUE(std::isfinite(v));
    // The next clean step is finite again.
    for (float v : decode(*codec, compress(*codec, clean, 2), n)) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST_P(QuantizerChecks, AccumulateAddsToOutput) {
  auto codec = make_codec(GetParam());
  const std::size_t n = 1500;
  const auto grad = normal_values(n, 5);
  const auto payload = compress(*codec, grad, 0);
  const auto once = decode(*codec, payload, n);
  std::vector<float> out(n, 1.0f);
  codec->decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kAccumulate);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 1.0f + once[i]) << i;
}

TEST_P(QuantizerChecks, SpecRoundTripsAndPayloadFitsBound) {
  auto codec = make_codec(GetParam());
  auto again = make_codec(codec->spec());
  EXPECT_EQ(again->spec(), codec->spec());
  for (std::size_t n : {1u, 7u, 8u, 511u, 513u, 4096u}) {
    const auto payload = compress(*codec, normal_values(n, 1), 0, fmt::format("t{}", n));
    EXPECT_LE(payload.size(), codec->max_payload_bytes(n));
    EXPECT_EQ(payload::parse(payload, payload::peek_header(payload).codec, static_cast<long long>(n)).header.numel, n);
  }
}

}  // namespace gradcomp::testing
