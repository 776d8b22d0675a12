// Error feedback keyed by the user's tensor name inside fused buffers and chunks (CompressContext::segments): the
// state follows the name whatever the grouping, the non-finite policy applies per segment, and bad segment lists are
// refused before any state changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gradcomp/error.h"
#include "sparse_test_util.h"

namespace gradcomp::testing {
namespace {

std::vector<std::byte> compress_segments(Compressor& c, const std::vector<float>& grad, std::string_view name,
                                         std::uint64_t step, const std::vector<TensorSegment>& segments) {
  CompressContext ctx;
  ctx.name = name;
  ctx.step = step;
  ctx.segments = segments;
  return compress_to_vector(c, TensorView::of(std::span<const float>(grad)), ctx);
}

std::vector<float> concat(const std::vector<float>& x, const std::vector<float>& y) {
  std::vector<float> out = x;
  out.insert(out.end(), y.begin(), y.end());
  return out;
}

// One named tensor carried whole as a segment is the same call as no segments: same payload, same state.
TEST(Segments, OneWholeSegmentEqualsThePlainCall) {
  for (const char* spec : {"topk:ratio=0.05", "qsgd", "dgc:ratio=0.01", "onebit", "fp16", "randomk"}) {
    auto plain = make_compressor(spec);
    auto segmented = make_compressor(spec);
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto grad = make_values(3001, static_cast<unsigned>(step + 1), false);
      const auto a = compress(*plain, grad, "w", step);
      const auto b = compress_segments(*segmented, grad, "w", step, {TensorSegment{"w", 0, grad.size(), 0, 0}});
      ASSERT_EQ(a, b) << spec << " step " << step;
    }
    EXPECT_EQ(plain->save_state(), segmented->save_state()) << spec;
  }
}

// Fused [a | b], then a alone and b cut into two chunks: every element keeps residual + sent == residual before +
// grad under its own name, and the state is sized like the named tensor, not like the buffer or chunk.
TEST(Segments, StateFollowsTheNameAcrossGroupingsAndChunks) {
  for (const char* spec : {"topk:ratio=0.05", "qsgd:bits=4", "terngrad", "onebit", "fp16"}) {
    auto c = make_compressor(spec);
    const std::size_t na = 1000, nb = 2500;
    std::vector<float> ra(na, 0.0f), rb(nb, 0.0f);
    auto check = [&](const std::vector<float>& grad_a, const std::vector<float>& grad_b,
                     const std::vector<float>& sent_a, const std::vector<float>& sent_b, int step) {
      const auto new_a = residual(*c, "a"), new_b = residual(*c, "b");
      ASSERT_EQ(new_a.size(), na);
      ASSERT_EQ(new_b.size(), nb);
      for (std::size_t i = 0; i < na; ++i) {
        ASSERT_NEAR(new_a[i] + sent_a[i], ra[i] + grad_a[i], 1e-5f * (1 + std::fabs(ra[i] + grad_a[i])))
            << spec << " a[" << i << "] step " << step;
      }
      for (std::size_t i = 0; i < nb; ++i) {
        ASSERT_NEAR(new_b[i] + sent_b[i], rb[i] + grad_b[i], 1e-5f * (1 + std::fabs(rb[i] + grad_b[i])))
            << spec << " b[" << i << "] step " << step;
      }
      ra = new_a;
      rb = new_b;
    };
    // Step 0: fused.
    auto ga = make_values(na, 1, false), gb = make_values(nb, 2, false);
    auto fused = concat(ga, gb);
    const std::vector<TensorSegment> both = {{"a", 0, na, 0, 0}, {"b", na, nb, 0, 0}};
    auto sent = decode(*c, compress_segments(*c, fused, "buf", 0, both), na + nb);
    check(ga, gb, std::vector<float>(sent.begin(), sent.begin() + na),
          std::vector<float>(sent.begin() + na, sent.end()), 0);
    // Step 1: a alone, b in two chunks ([0, 1200) with a's tail would be another layout; here b alone, split).
    ga = make_values(na, 3, false);
    gb = make_values(nb, 4, false);
    const auto sent_a = decode(*c, compress(*c, ga, "a", 1), na);
    const std::size_t cut = 1200;
    const std::vector<float> first(gb.begin(), gb.begin() + cut), second(gb.begin() + cut, gb.end());
    const auto s1 = decode(*c, compress_segments(*c, first, "b#chunk0", 1, {{"b", 0, cut, 0, nb}}), cut);
    const auto s2 =
        decode(*c, compress_segments(*c, second, "b#chunk1", 1, {{"b", 0, nb - cut, cut, nb}}), nb - cut);
    check(ga, gb, sent_a, concat(s1, s2), 1);
    EXPECT_EQ(state(*c, "b").steps, 2u) << "a tensor split into chunks takes one step per call round";
    // Step 2: fused the other way round.
    ga = make_values(na, 5, false);
    gb = make_values(nb, 6, false);
    fused = concat(gb, ga);
    sent = decode(*c, compress_segments(*c, fused, "buf2", 2, {{"b", 0, nb, 0, 0}, {"a", nb, na, 0, 0}}), na + nb);
    check(ga, gb, std::vector<float>(sent.begin() + nb, sent.end()),
          std::vector<float>(sent.begin(), sent.begin() + nb), 2);
    const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(c.get());
    EXPECT_EQ(ef->state_of("buf"), nullptr) << spec << ": no state may be keyed by a buffer name";
  }
}

// A repeated layout keeps its members' state in one block between calls (no gather, no scatter); reading a member
// (state_of, save_state) or using it elsewhere refreshes it first. Either way the bits are those of a compressor that
// is made to refresh after every call.
TEST(Segments, RepeatedLayoutsGiveTheBitsOfRefreshedState) {
  for (const char* spec : {"topk:ratio=0.05", "qsgd:bits=4", "dgc:ratio=0.02"}) {
    auto cached = make_compressor(spec);
    auto refreshed = make_compressor(spec);
    const std::vector<TensorSegment> layout = {{"a", 0, 900, 0, 0}, {"b", 900, 1300, 0, 0}};
    for (std::uint64_t step = 0; step < 4; ++step) {
      const auto grad = make_values(2200, static_cast<unsigned>(10 + step), false);
      const auto x = compress_segments(*cached, grad, "buf", step, layout);
      const auto y = compress_segments(*refreshed, grad, "buf", step, layout);
      ASSERT_EQ(x, y) << spec << " step " << step;
      (void)state(*refreshed, "a");  // flushes a's newest values out of the block
      if (step == 2) {
        // b alone in between, on both: the block must give b up and take it back.
        const auto alone = make_values(1300, 77, false);
        ASSERT_EQ(compress(*cached, alone, "b", step), compress(*refreshed, alone, "b", step)) << spec;
      }
    }
    EXPECT_EQ(cached->save_state(), refreshed->save_state()) << spec;
  }
}

// A fused layout's state stays in one block between calls (ErrorFeedbackCompressor::resident_work): other layouts
// of the same tensors, a NaN skipped inside the block, and a state loaded meanwhile must give the bits of a
// compressor whose state is flushed back to the tensors after every call.
TEST(Segments, ResidentBlocksSurviveOtherLayoutsSkipsAndLoads) {
  for (const char* spec : {"dgc:ratio=0.02,nonfinite=skip", "topk:ratio=0.05,nonfinite=skip", "qsgd:nonfinite=skip"}) {
    auto cached = make_compressor(spec);
    auto refreshed = make_compressor(spec);
    const std::vector<TensorSegment> ab = {{"a", 0, 900, 0, 0}, {"b", 900, 1300, 0, 0}};
    const std::vector<TensorSegment> ba = {{"b", 0, 1300, 0, 0}, {"a", 1300, 900, 0, 0}};
    for (std::uint64_t step = 0; step < 6; ++step) {
      auto grad = make_values(2200, static_cast<unsigned>(40 + step), false);
      if (step == 3) grad[1000] = std::nanf("");  // b skips this step, a takes it
      const bool swapped = step == 2;  // the same tensors in another layout (another call) in between
      const auto x = compress_segments(*cached, grad, swapped ? "other" : "buf", step, swapped ? ba : ab);
      const auto y = compress_segments(*refreshed, grad, swapped ? "other" : "buf", step, swapped ? ba : ab);
      ASSERT_EQ(x, y) << spec << " step " << step;
      (void)state(*refreshed, "b");
      if (step == 4) {
        const auto saved = refreshed->save_state();
        cached->load_state(saved);
        refreshed->load_state(saved);
      }
    }
    EXPECT_EQ(cached->save_state(), refreshed->save_state()) << spec;
  }
}

const char* const kEveryCodec[] = {"none", "fp16", "bf16", "qsgd:bits=4", "qsgd:bits=2,bucket=128", "terngrad",
                                   "onebit", "topk:ratio=0.05", "topk:k=7,values=f16", "randomk:ratio=0.1",
                                   "blocktopk:ratio=0.1,block=16", "dgc:ratio=0.02,warmup_steps=1"};

// Fusion invariance: a tensor fused with others (in any order, any neighbours) is compressed exactly as it is alone:
// the decoded values of its part of the fused payload are bit-identical to its lone payload's, and its state (residual,
// momentum, steps) is bit-identical after every step.
TEST(Segments, FusedIsBitIdenticalToAlone) {
  const std::vector<std::size_t> sizes = {1000, 37, 2500, 1};
  const char* names[] = {"w0", "w1", "w2", "w3"};
  for (const char* spec : kEveryCodec) {
    auto fused = make_compressor(spec);
    auto alone = make_compressor(spec);
    for (std::uint64_t step = 0; step < 4; ++step) {
      // Every other step the tensors come in reverse order (another layout of the same tensors).
      std::vector<std::size_t> order = {0, 1, 2, 3};
      if (step % 2) std::reverse(order.begin(), order.end());
      std::vector<float> buffer;
      std::vector<TensorSegment> layout;
      std::vector<std::vector<float>> grads(sizes.size());
      for (std::size_t t : order) {
        grads[t] = make_values(sizes[t], 100 * step + t + 1, false);
        layout.push_back(TensorSegment{names[t], buffer.size(), sizes[t], 0, 0});
        buffer.insert(buffer.end(), grads[t].begin(), grads[t].end());
      }
      const auto decoded = decode(*fused, compress_segments(*fused, buffer, "bucket", step, layout), buffer.size());
      for (std::size_t k = 0; k < order.size(); ++k) {
        const std::size_t t = order[k];
        const auto lone = decode(*alone, compress(*alone, grads[t], names[t], step), sizes[t]);
        const std::vector<float> part(decoded.begin() + static_cast<std::ptrdiff_t>(layout[k].offset),
                                      decoded.begin() + static_cast<std::ptrdiff_t>(layout[k].offset + sizes[t]));
        ASSERT_EQ(bits_of(part), bits_of(lone)) << spec << " tensor " << names[t] << " step " << step;
      }
      ASSERT_EQ(fused->save_state(), alone->save_state()) << spec << " step " << step;
    }
  }
}

// The same for parts of tensors (scatter-reduce-allgather's chunks): a chunk carrying pieces of several tensors
// compresses each piece as the chunk of that tensor alone would.
TEST(Segments, ChunksOfSeveralTensorsAreBitIdenticalToChunksAlone) {
  for (const char* spec : {"qsgd:bits=4", "terngrad", "onebit", "topk:ratio=0.05", "randomk:ratio=0.1"}) {
    auto fused = make_compressor(spec);
    auto alone = make_compressor(spec);
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto a = make_values(300, 7 + step, false), b = make_values(1200, 9 + step, false);
      std::vector<float> chunk(a.begin() + 100, a.begin() + 200);
      chunk.insert(chunk.end(), b.begin() + 400, b.begin() + 800);
      const std::vector<TensorSegment> pieces = {{"a", 0, 100, 100, 300}, {"b", 100, 400, 400, 1200}};
      const auto decoded = decode(*fused, compress_segments(*fused, chunk, "x#chunk1", step, pieces), 500);
      const std::vector<float> pa(a.begin() + 100, a.begin() + 200), pb(b.begin() + 400, b.begin() + 800);
      const auto da = decode(*alone, compress_segments(*alone, pa, "a#chunk1", step, {{"a", 0, 100, 100, 300}}), 100);
      const auto db = decode(*alone, compress_segments(*alone, pb, "b#chunk1", step, {{"b", 0, 400, 400, 1200}}), 400);
      ASSERT_EQ(bits_of(std::vector<float>(decoded.begin(), decoded.begin() + 100)), bits_of(da)) << spec;
      ASSERT_EQ(bits_of(std::vector<float>(decoded.begin() + 100, decoded.end())), bits_of(db)) << spec;
      ASSERT_EQ(fused->save_state(), alone->save_state()) << spec << " step " << step;
    }
  }
}

// A segmented payload whose part is corrupt is refused before anything is written; a truncated table too.
TEST(Segments, ACorruptPartLeavesTheWholeOutputUntouched) {
  for (const char* spec : {"topk:ratio=0.05", "qsgd", "randomk:ratio=0.1", "blocktopk:ratio=0.1,block=16", "dgc"}) {
    auto c = make_compressor(spec);
    const auto grad = make_values(3000, 3, false);
    const auto payload =
        compress_segments(*c, grad, "bucket", 0, {{"p", 0, 1000, 0, 0}, {"q", 1000, 1500, 0, 0}, {"r", 2500, 500, 0, 0}});
    std::size_t refused = 0;
    for (std::size_t at = 0; at < payload.size(); at += 7) {
      auto bad = payload;
      bad[at] ^= std::byte{0x5A};
      std::vector<float> out(3000, 42.0f);
      try {
        c->decompress(bad, TensorView(out.data(), out.size(), DType::kF32), DecodeMode::kAccumulate);
      } catch (const CorruptPayload&) {
        ++refused;
        ASSERT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 42.0f; }))
            << spec << ": byte " << at << " flipped, refused, but the output was written";
      }
    }
    EXPECT_GT(refused, payload.size() / 70) << spec;
    auto cut = payload;
    cut.resize(cut.size() - 3);
    std::vector<float> out(3000, 0.0f);
    EXPECT_THROW(c->decompress(cut, TensorView(out.data(), out.size(), DType::kF32), DecodeMode::kOverwrite),
                 CorruptPayload);
  }
}

TEST(Segments, RaiseNamesTheSegmentAndItsOwnIndex) {
  auto c = make_compressor("qsgd");
  auto grad = make_values(300, 1, false);
  grad[250] = std::nanf("");
  try {
    compress_segments(*c, grad, "fused[x+1]#300", 0, {{"x", 0, 200, 0, 0}, {"y", 200, 100, 0, 0}});
    FAIL() << "a NaN under nonfinite=raise must throw";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("gradient 'y' (carried in 'fused[x+1]#300')"), std::string::npos) << message;
    EXPECT_NE(message.find("index 50"), std::string::npos) << message;
  }
  const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(c.get());
  EXPECT_TRUE(ef->state_of("x") == nullptr || std::all_of(ef->state_of("x")->buffers[0].begin(),
                                                          ef->state_of("x")->buffers[0].end(),
                                                          [](float v) { return v == 0.0f; }));
}

// A chunk (part of one tensor) is encoded in place on its range; a NaN there still follows the policy, naming the
// tensor's own index, and skip leaves the whole tensor's state as it was.
TEST(Segments, AChunkWithANaNFollowsThePolicy) {
  auto raising = make_compressor("qsgd");
  auto grad = make_values(100, 4, false);
  grad[10] = std::nanf("");
  try {
    compress_segments(*raising, grad, "w#chunk1", 0, {{"w", 0, 100, 300, 1000}});
    FAIL() << "a NaN under nonfinite=raise must throw";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("index 310"), std::string::npos) << error.what();
  }
  auto skipping = make_compressor("qsgd:nonfinite=skip");
  compress_segments(*skipping, make_values(100, 5, false), "w#chunk1", 0, {{"w", 0, 100, 300, 1000}});
  const auto before = residual(*skipping, "w");
  compress_segments(*skipping, grad, "w#chunk1", 1, {{"w", 0, 100, 300, 1000}});
  EXPECT_TRUE(skipping->last_stats().skipped);
  EXPECT_EQ(residual(*skipping, "w"), before);
}

// skip: the bad segment is sent as zeros and keeps its state; the good one takes its step, exactly as if it had been
// compressed next to a zero tensor with no residual.
TEST(Segments, SkipIsPerSegment) {
  for (const char* spec : {"topk:ratio=0.05,nonfinite=skip", "qsgd:nonfinite=skip", "dgc:ratio=0.02,nonfinite=skip",
                           "fp16:nonfinite=skip"}) {
    auto c = make_compressor(spec);
    const std::vector<TensorSegment> layout = {{"x", 0, 700, 0, 0}, {"y", 700, 900, 0, 0}};
    compress_segments(*c, make_values(1600, 1, false), "buf", 0, layout);
    const TensorState before_x = state(*c, "x"), before_y = state(*c, "y");
    auto grad = make_values(1600, 2, false);
    grad[800] = INFINITY;
    const auto payload = compress_segments(*c, grad, "buf", 1, layout);
    EXPECT_TRUE(c->last_stats().skipped);
    EXPECT_EQ(c->last_stats().nonfinite, 1u);
    const auto sent = decode(*c, payload, 1600);
    for (std::size_t i = 700; i < 1600; ++i) ASSERT_EQ(sent[i], 0.0f) << spec << " y[" << i - 700 << "]";
    EXPECT_EQ(state(*c, "y").buffers, before_y.buffers) << spec << ": y's state changed";
    EXPECT_EQ(state(*c, "y").steps, before_y.steps);
    EXPECT_NE(state(*c, "x").buffers, before_x.buffers) << spec << ": x took no step";
    EXPECT_EQ(state(*c, "x").steps, before_x.steps + 1);
  }
}

TEST(Segments, PassKeepsNoNonFiniteValueInAnyState) {
  for (const char* spec : {"topk:ratio=0.05,nonfinite=pass", "qsgd:nonfinite=pass", "dgc:ratio=0.02,nonfinite=pass"}) {
    auto c = make_compressor(spec);
    auto grad = make_values(1600, 2, false);
    grad[10] = std::nanf("");
    grad[900] = -INFINITY;
    compress_segments(*c, grad, "buf", 0, {{"x", 0, 700, 0, 0}, {"y", 700, 900, 0, 0}});
    for (const char* name : {"x", "y"}) {
      for (const auto& buffer : state(*c, name).buffers) {
        for (float v : buffer) ASSERT_TRUE(std::isfinite(v)) << spec << " " << name;
      }
    }
  }
}

TEST(Segments, BadListsAreRefusedBeforeAnyStateChanges) {
  auto c = make_compressor("topk:ratio=0.1");
  const auto grad = make_values(100, 1, false);
  compress(*c, grad, "known", 0);
  const auto before = c->save_state();
  auto refused = [&](const std::vector<TensorSegment>& segments, const char* why) {
    EXPECT_THROW(compress_segments(*c, grad, "buf", 1, segments), InvalidArgument) << why;
    EXPECT_EQ(c->save_state(), before) << why << ": a refused call changed the state";
  };
  refused({{"p", 0, 40, 0, 0}, {"q", 50, 50, 0, 0}}, "gap");
  refused({{"p", 0, 60, 0, 0}, {"q", 50, 50, 0, 0}}, "overlap");
  refused({{"p", 0, 40, 0, 0}, {"q", 40, 40, 0, 0}}, "short");
  refused({{"p", 0, 50, 0, 0}, {"p", 50, 50, 0, 0}}, "a name twice");
  refused({{"", 0, 100, 0, 0}}, "empty name");
  refused({{"p", 0, 100, 30, 120}}, "past the named tensor's end");
  refused({{"new", 0, 30, 0, 0}, {"known", 30, 70, 0, 0}}, "known has 100 elements, not 70");
}

}  // namespace
}  // namespace gradcomp::testing
