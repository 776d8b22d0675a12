// Helpers shared by the sparsifier tests (topk, randomk, blocktopk, dgc): compress/decode wrappers, state access and
// the checks every sparsifier must pass (exact error feedback, thread-count independence, state save/load, corrupt
// payloads, tiny tensors).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/payload.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/philox_ops.cuh"

namespace gradcomp::testing {

// Deterministic normal-ish values (sum of uniforms), scaled; `ties` quantizes them to a few levels so ties occur.
inline std::vector<float> make_values(std::size_t n, std::uint64_t seed, bool ties = false) {
  std::vector<float> values(n);
  const auto stream = kernels::PhiloxStream::make(seed, 77, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto block = stream.block(i);
    float x = kernels::uniform01(block.v[0]) + kernels::uniform01(block.v[1]) + kernels::uniform01(block.v[2]) - 1.5f;
    if (ties) x = std::round(x * 8.0f) / 8.0f;
    values[i] = x;
  }
  return values;
}

inline std::vector<std::byte> compress(Compressor& c, const std::vector<float>& grad, std::string_view name,
                                       std::uint64_t step, float prescale = 1.0f) {
  CompressContext ctx;
  ctx.name = name;
  ctx.step = step;
  ctx.prescale = prescale;
  return compress_to_vector(c, TensorView::of(std::span<const float>(grad)), ctx);
}

inline std::vector<float> decode(Compressor& c, const std::vector<std::byte>& payload, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  c.decompress(payload, TensorView::of(std::span<float>(out)), DecodeMode::kOverwrite);
  return out;
}

inline const TensorState& state(const Compressor& c, std::string_view name) {
  const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(&c);
  EXPECT_NE(ef, nullptr);
  const TensorState* s = ef->state_of(name);
  EXPECT_NE(s, nullptr) << name;
  return *s;
}

inline std::vector<float> residual(const Compressor& c, std::string_view name) { return state(c, name).buffers[0]; }

// int32 indices of section 0 of an (index, value) / block-id payload.
inline std::vector<std::int32_t> section_ints(const std::vector<std::byte>& bytes, std::size_t section) {
  const payload::Header header = payload::peek_header(bytes);
  std::vector<std::int32_t> ints(header.section_bytes[section] / 4);
  if (!ints.empty()) std::memcpy(ints.data(), bytes.data() + payload::section_offset(header, section), ints.size() * 4);
  return ints;
}

inline std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), values.size() * 4);
  return bits;
}

// residual_after + transmitted == residual_before + grad, bit for bit, over several steps (v = r + g rounds once in
// f32, the sent entries leave the residual exactly).
inline void expect_exact_error_feedback(const std::string& spec, std::size_t n, int steps) {
  auto c = make_compressor(spec);
  std::vector<float> before(n, 0.0f);
  for (int step = 0; step < steps; ++step) {
    const auto grad = make_values(n, 100 + step);
    const auto payload = compress(*c, grad, "w", step);
    const auto sent = decode(*c, payload, n);
    const auto after = residual(*c, "w");
    ASSERT_EQ(after.size(), n);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float lhs = after[i] + sent[i];
      const float rhs = before[i] + grad[i];
      if (std::memcmp(&lhs, &rhs, 4) != 0) ++mismatches;
      // The sent entries leave nothing behind (f32 values, prescale 1).
      if (sent[i] != 0.0f && after[i] != 0.0f) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0u) << spec << " step " << step;
    before = after;
  }
}

// Payloads are identical for 1 and 4 threads, over a tensor spanning several parallel chunks.
inline void expect_thread_independent(const std::string& spec, std::size_t n, int steps = 3) {
  auto one = make_compressor(spec);
  auto four = make_compressor(spec);
  one->set_threads(1);
  four->set_threads(4);
  for (int step = 0; step < steps; ++step) {
    const auto grad = make_values(n, 200 + step);
    EXPECT_EQ(compress(*one, grad, "t", step), compress(*four, grad, "t", step)) << spec << " step " << step;
  }
  EXPECT_EQ(bits_of(residual(*one, "t")), bits_of(residual(*four, "t")));
}

// 3 steps, save, 2 more; a fresh instance loaded from the save repeats the 2 steps with identical payloads.
inline void expect_state_round_trip(const std::string& spec, std::size_t n) {
  auto a = make_compressor(spec);
  for (int step = 0; step < 3; ++step) compress(*a, make_values(n, 300 + step), "s", step);
  const auto saved = a->save_state();
  std::vector<std::vector<std::byte>> first, second;
  for (int step = 3; step < 5; ++step) first.push_back(compress(*a, make_values(n, 300 + step), "s", step));
  auto b = make_compressor(spec);
  b->load_state(saved);
  for (int step = 3; step < 5; ++step) second.push_back(compress(*b, make_values(n, 300 + step), "s", step));
  EXPECT_EQ(first, second) << spec;
  EXPECT_EQ(a->save_state(), b->save_state()) << spec;
  // A fresh instance without the state diverges (the check can fail).
  auto c = make_compressor(spec);
  EXPECT_NE(compress(*c, make_values(n, 303), "s", 3), first[0]) << spec;
}

// Every truncation and every single-byte corruption of a valid payload either decodes or throws CorruptPayload, and a
// throw leaves `out` untouched. Returns how many corruptions were rejected.
inline std::size_t expect_corruptions_rejected(const std::string& spec, std::size_t n) {
  auto c = make_compressor(spec);
  compress(*c, make_values(n, 1), "c", 0);
  const auto payload = compress(*c, make_values(n, 2), "c", 1);
  std::vector<float> out(n, 7.0f);
  const auto view = TensorView::of(std::span<float>(out));
  std::size_t rejected = 0;
  auto try_decode = [&](const std::vector<std::byte>& bytes) {
    std::fill(out.begin(), out.end(), 7.0f);
    try {
      c->decompress(bytes, view, DecodeMode::kOverwrite);
    } catch (const CorruptPayload&) {
      ++rejected;
      for (const float x : out) ASSERT_EQ(x, 7.0f) << spec << ": a rejected payload wrote to the output";
    }
  };
  for (std::size_t length = 0; length < payload.size(); ++length) {
    try_decode(std::vector<std::byte>(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(length)));
  }
  for (std::size_t at = 0; at < payload.size(); ++at) {
    for (const unsigned char flip : {0x01, 0x80, 0xff}) {
      auto bytes = payload;
      bytes[at] ^= std::byte{flip};
      try_decode(bytes);
    }
  }
  return rejected;
}

// 0- and 1-element tensors and k >= numel: compress, decode and keep exact error feedback.
inline void expect_tiny_tensors_work(const std::string& spec) {
  for (const std::size_t n : {0u, 1u, 2u, 3u}) {
    auto c = make_compressor(spec);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> grad(n, 0.5f + static_cast<float>(step));
      const auto payload = compress(*c, grad, "tiny", step);
      EXPECT_LE(payload.size(), c->max_payload_bytes(n));
      const auto sent = decode(*c, payload, n);
      if (n > 0) {
        // k = max(1, round(ratio*n)) >= 1: something is sent every step.
        std::size_t nonzero = 0;
        for (const float x : sent) nonzero += x != 0.0f;
        EXPECT_GE(nonzero, 1u) << spec << " n=" << n;
      }
    }
  }
}

}  // namespace gradcomp::testing
