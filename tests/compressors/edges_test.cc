// Edges of the codecs and the registry (issue 15, item 5): non-ASCII compressor names, unknown header flags on the
// `none` decoder, buckets of tiny (below ~levels / FLT_MAX, and subnormal) scale in QSGD and TernGrad, and the int32
// index limit of the sparsifiers checked before any state is allocated.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/qsgd_ops.cuh"

namespace gradcomp {
namespace {

std::vector<std::byte> compress(Compressor& codec, const std::vector<float>& grad, std::uint64_t step) {
  std::vector<std::byte> out(codec.max_payload_bytes(grad.size()));
  CompressContext ctx;
  ctx.name = "edge";
  ctx.step = step;
  out.resize(codec.compress(TensorView::of(std::span(grad)), out, ctx));
  return out;
}

std::vector<float> decode(Compressor& codec, std::span<const std::byte> payload, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  codec.decompress(payload, TensorView::of(std::span(out)), DecodeMode::kOverwrite);
  return out;
}

TEST(CompressorNames, NonAsciiAndOtherInvalidNamesAreRefusedWithTheRule) {
  for (const std::string name : {"ñame", "na\xC3\xB1" "e", "Name", "a-b", "", "top k", "caf\xE9"}) {
    try {
      check_compressor_name(name);
      ADD_FAILURE() << "accepted '" << name << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("[a-z0-9_]+"), std::string::npos) << e.what();
    }
    Registry registry;
    CompressorInfo info;
    info.name = name;
    info.factory = [](const Params&) -> std::unique_ptr<Compressor> { return nullptr; };
    EXPECT_THROW(registry.add(info), InvalidArgument) << name;
    EXPECT_FALSE(registry.contains(name));
  }
  EXPECT_NO_THROW(check_compressor_name("my_codec_2"));
}

TEST(NoneDecoder, UnknownHeaderFlagsAreCorruption) {
  auto codec = make_compressor("none");
  const std::vector<float> grad = {1.0f, -2.0f, 3.5f};
  const auto payload = compress(*codec, grad, 0);
  EXPECT_EQ(decode(*codec, payload, grad.size()), grad);
  for (const std::uint16_t flags : {std::uint16_t{0x1}, std::uint16_t{0x2}, std::uint16_t{0x8000}}) {
    auto bad = payload;
    std::memcpy(bad.data() + 18, &flags, sizeof(flags));  // header offset 18: u16 flags (compressors/framework/payload.h)
    std::vector<float> out(grad.size(), 7.0f);
    EXPECT_THROW(codec->decompress(bad, TensorView::of(std::span(out)), DecodeMode::kOverwrite), CorruptPayload)
        << "flags " << flags;
    EXPECT_EQ(out, std::vector<float>(grad.size(), 7.0f)) << "a refused payload wrote the output";
  }
}

// Mean of `steps` decodes (ef=off: independent draws) of a bucket scaled to max |v| = `scale`; every element's mean
// must be within 6 standard errors of v (the draw is floor or ceil of |v| / unit), and every single decode within
// one unit of v.
void expect_unbiased(const std::string& spec, unsigned bits, float scale) {
  const std::size_t n = 512;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = scale * (static_cast<float>((i * 37) % 101) / 50.0f - 1.0f);  // in [-scale, scale], both ends hit
  }
  auto codec = make_compressor(spec);
  const int steps = 400;
  std::vector<double> mean(n, 0.0);
  const double unit = static_cast<double>(scale) / kernels::signmag_levels(bits);
  const double slack = 1e-6 * unit + 1.5e-45;  // decoded values round to the f32 (subnormal) grid
  double worst = 0.0;
  for (int step = 0; step < steps; ++step) {
    const auto q = decode(*codec, compress(*codec, v, static_cast<std::uint64_t>(step)), n);
    for (std::size_t i = 0; i < n; ++i) {
      mean[i] += q[i];
      worst = std::max(worst, std::fabs(static_cast<double>(q[i]) - v[i]));
    }
  }
  EXPECT_LE(worst, unit + slack) << spec << " scale " << scale << ": a decode is more than one unit off";
  const double tolerance = 3.0 * unit / std::sqrt(static_cast<double>(steps)) + slack;
  int biased = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double error = mean[i] / steps - v[i];
    if (std::fabs(error) > tolerance && biased++ < 3) {
      ADD_FAILURE() << spec << " scale " << scale << ": element " << i << " = " << v[i] << " decodes to "
                    << mean[i] / steps << " on average (tolerance " << tolerance << ")";
    }
  }
}

TEST(TinyScales, QsgdBucketsBelowLevelsOverFltMaxAreUnbiased) {
  for (const float scale : {1e-37f, 1e-40f, 3e-43f, 0x1p-100f * 0.75f, 1e-30f, 0.5f}) {
    expect_unbiased("qsgd:bits=8,ef=off", 8, scale);
    expect_unbiased("qsgd:bits=4,ef=off", 4, scale);
    expect_unbiased("qsgd:bits=2,bucket=128,ef=off", 2, scale);
  }
}

TEST(TinyScales, TernGradSubnormalBucketsAreUnbiased) {
  for (const float scale : {1e-40f, 1e-37f, 1e-25f}) {
    expect_unbiased("terngrad:clip=0,ef=off", 2, scale);
  }
  // With clipping, a bucket of tiny values (their squares underflow) used to clip to 0 and send nothing.
  auto codec = make_compressor("terngrad:ef=off");
  const std::vector<float> v(512, 1e-30f);
  double sum = 0.0;
  for (int step = 0; step < 50; ++step) {
    for (float x : decode(*codec, compress(*codec, v, static_cast<std::uint64_t>(step)), v.size())) sum += x;
  }
  EXPECT_NEAR(sum / (50.0 * 512.0), 1e-30, 1e-33);
}

TEST(TinyScales, ErrorFeedbackInvariantHoldsForTinyBuckets) {
  // residual + transmitted == grad (the residual starts at 0) on the rescaled path too, element by element.
  for (const char* spec : {"qsgd:bits=8", "qsgd:bits=4", "terngrad:clip=0"}) {
    auto codec = make_compressor(spec);
    std::vector<float> v(1000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1e-38f * std::sin(static_cast<float>(i));
    const auto q = decode(*codec, compress(*codec, v, 0), v.size());
    const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(codec.get());
    ASSERT_NE(ef, nullptr);
    const TensorState* state = ef->state_of("edge");
    ASSERT_NE(state, nullptr);
    const std::vector<float>& residual = state->buffers[0];
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(residual[i] + q[i], v[i]) << spec << " element " << i << ": residual " << residual[i] << ", sent "
                                          << q[i];
    }
  }
}

// Runs `spec`'s compress on a 2^31-element tensor of untouchable memory (PROT_NONE) in a child process whose address
// space leaves room for ~1.5 GB more: the size error must come first, before any state is allocated or any value
// read. Exit codes: 0 = InvalidArgument naming the limit, 1 = another error, 2 = no error.
int compress_too_large_in_child(const std::string& spec) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::size_t n = std::size_t{1} << 31;
    void* data = mmap(nullptr, n * sizeof(float), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data == MAP_FAILED) _exit(3);
    std::size_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = pages * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{3} << 29);
    const rlimit cap{limit, limit};
    setrlimit(RLIMIT_AS, &cap);
    try {
      auto codec = make_compressor(spec);
      std::vector<std::byte> out(4096);
      CompressContext ctx;
      ctx.name = "huge";
      codec->compress(TensorView(data, n, DType::kF32), out, ctx);
    } catch (const InvalidArgument& e) {
      _exit(std::string(e.what()).find("2147483647") != std::string::npos ? 0 : 1);
    } catch (...) {
      _exit(1);
    }
    _exit(2);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(IndexLimit, TooLargeTensorsAreRefusedBeforeAnyAllocation) {
  for (const char* spec : {"topk:ratio=0.001", "randomk:ratio=0.001", "blocktopk:ratio=0.001", "dgc:ratio=0.001",
                           "topk:ratio=0.001,ef=off"}) {
    EXPECT_EQ(compress_too_large_in_child(spec), 0) << spec << " (1: another error, e.g. bad_alloc; 2: no error)";
    auto codec = make_compressor(spec);
    EXPECT_THROW(codec->max_payload_bytes(std::size_t{1} << 31), InvalidArgument) << spec;
    EXPECT_NO_THROW(codec->max_payload_bytes((std::size_t{1} << 31) - 1)) << spec;
  }
}

}  // namespace
}  // namespace gradcomp
