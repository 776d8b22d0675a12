// CPU == GPU for every codec with a CUDA path: bit-identical payloads over several error-feedback steps (stochastic
// codecs under the same seed), identical saved state, GPU payloads decoded on the CPU and CPU payloads decoded on the
// GPU, f16/bf16 tensors, unaligned views, the non-finite policies, and the error-feedback invariant on the GPU.
// Without a CUDA device the executable reports SKIPPED (exit 77).
//
// Under compute-sanitizer:  compute-sanitizer --tool memcheck build/tests/gpu/codec_parity_gpu_test
//                           compute-sanitizer --tool racecheck build/tests/gpu/codec_parity_gpu_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/payload.h"
#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/half_ops.cuh"
#include "kernels/usage_counters.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/parity_data.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;

// Payload bytes in cuda:0's memory (the default stream), as a caller labels them.
const Memory kOnGpu = Memory::on(Device::cuda(0), nullptr);

std::vector<std::byte> payload_on_gpu(Compressor& compressor, const DeviceArray<float>& grad, std::size_t offset,
                                      std::size_t n, const CompressContext& ctx) {
  DeviceArray<std::byte> out(compressor.max_payload_bytes(n));
  TensorView view(grad.data() + offset, n, DType::kF32, Device::cuda(0));
  const std::size_t size = compressor.compress(view, std::span<std::byte>(out.data(), out.size()), ctx);
  EXPECT_LE(size, out.size());
  return out.download(size);
}

class Parity : public ::testing::TestWithParam<std::string> {};

// Several steps with error feedback: every payload and the final state match.
TEST_P(Parity, PayloadsAndStateAreBitIdentical) {
  for (const std::size_t n : parity::sizes()) {
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {  // 1: a view that is not 16-byte aligned
      auto cpu = make_compressor(GetParam());
      auto gpu = make_compressor(GetParam());
      for (std::uint64_t step = 0; step < 3; ++step) {
        const auto values = parity::random_values(n + 1, parity::step_seed(n, step));
        DeviceArray<float> device(values);
        CompressContext ctx;
        ctx.name = "layer.weight";
        ctx.step = step;
        ctx.world_size = 4;
        ctx.prescale = 0.25f;
        const std::vector<float> host(values.begin() + static_cast<long>(offset),
                                      values.begin() + static_cast<long>(offset + n));
        const auto expected = compress_to_vector(*cpu, TensorView::of(std::span<const float>(host)), ctx);
        const auto got = payload_on_gpu(*gpu, device, offset, n, ctx);
        ASSERT_EQ(got.size(), expected.size()) << GetParam() << " n=" << n << " step " << step;
        ASSERT_TRUE(std::memcmp(got.data(), expected.data(), got.size()) == 0)
            << GetParam() << ": GPU payload differs from the CPU's, n=" << n << " offset=" << offset << " step "
            << step;
        EXPECT_EQ(gpu->last_stats().selected, cpu->last_stats().selected);
        EXPECT_EQ(gpu->last_stats().saturated, cpu->last_stats().saturated);
      }
      EXPECT_EQ(gpu->save_state(), cpu->save_state()) << GetParam() << ": state after 3 steps differs, n=" << n;
    }
  }
}

// A GPU payload decodes on the CPU, and a CPU payload (host or device memory) on the GPU, to the same values.
TEST_P(Parity, CrossDeviceDecode) {
  const std::size_t n = 65537;
  auto cpu = make_compressor(GetParam());
  auto gpu = make_compressor(GetParam());
  const auto values = parity::random_values(n, 7);
  DeviceArray<float> device(values);
  CompressContext ctx;
  ctx.name = "t";
  ctx.prescale = 0.5f;
  const auto payload = payload_on_gpu(*gpu, device, 0, n, ctx);

  std::vector<float> on_cpu(n, 0.0f);
  cpu->decompress(payload, TensorView::of(std::span<float>(on_cpu)), DecodeMode::kOverwrite);

  DeviceArray<std::byte> device_payload(payload.size());
  device_payload.upload(payload);
  DeviceArray<float> out(n);
  gpu->decompress(PayloadBytes(std::span<const std::byte>(device_payload.data(), payload.size()), kOnGpu),
                  TensorView(out.data(), n, DType::kF32, Device::cuda(0)), DecodeMode::kOverwrite);
  const auto on_gpu = out.download();
  ASSERT_EQ(std::memcmp(on_gpu.data(), on_cpu.data(), n * sizeof(float)), 0) << GetParam();

  // Accumulate, from a host payload staged by the CUDA path.
  gpu->decompress(payload, TensorView(out.data(), n, DType::kF32, Device::cuda(0)), DecodeMode::kAccumulate);
  cpu->decompress(payload, TensorView::of(std::span<float>(on_cpu)), DecodeMode::kAccumulate);
  const auto twice = out.download();
  ASSERT_EQ(std::memcmp(twice.data(), on_cpu.data(), n * sizeof(float)), 0) << GetParam() << " (accumulate)";
}

// f16 and bf16 gradients and outputs take the same path as on the CPU.
TEST_P(Parity, HalfPrecisionTensors) {
  const std::size_t n = 30001;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    // Outliers finite in f16 (the default 1e5 is inf there, and nonfinite=raise would reject the CPU reference).
    const auto values = parity::random_values(n, 11, 0.1f, parity::kHalfOutlier);
    std::vector<std::uint16_t> bits(n);
    for (std::size_t i = 0; i < n; ++i) {
      bits[i] = dtype == DType::kF16 ? kernels::float_to_half_bits(values[i]) : kernels::float_to_bf16_bits(values[i]);
    }
    auto cpu = make_compressor(GetParam());
    auto gpu = make_compressor(GetParam());
    CompressContext ctx;
    ctx.name = "h";
    std::vector<std::byte> expected(cpu->max_payload_bytes(n));
    expected.resize(cpu->compress(TensorView(bits.data(), n, dtype), expected, ctx));
    DeviceArray<std::uint16_t> device(bits);
    DeviceArray<std::byte> out(gpu->max_payload_bytes(n));
    const std::size_t size = gpu->compress(TensorView(device.data(), n, dtype, Device::cuda(0)),
                                           std::span<std::byte>(out.data(), out.size()), ctx);
    ASSERT_EQ(out.download(size), expected) << GetParam() << " " << dtype_name(dtype);

    std::vector<std::uint16_t> cpu_out(n, 0);
    cpu->decompress(expected, TensorView(cpu_out.data(), n, dtype), DecodeMode::kOverwrite);
    DeviceArray<std::uint16_t> gpu_out(n);
    gpu->decompress(PayloadBytes(std::span<const std::byte>(out.data(), size), kOnGpu),
                    TensorView(gpu_out.data(), n, dtype, Device::cuda(0)), DecodeMode::kOverwrite);
    ASSERT_EQ(gpu_out.download(), cpu_out) << GetParam() << " decode to " << dtype_name(dtype);
  }
}

// Error feedback on the GPU: residual_after + decoded / wire scale == residual_before + grad, up to the f32 rounding
// of the subtraction and the addition (parity::ef_tolerance, checked on the CPU by codec_parity_reference_test).
TEST_P(Parity, ErrorFeedbackInvariantOnGpu) {
  auto gpu = make_compressor(GetParam());
  if (!gpu->traits().lossy || gpu->spec().find("ef=off") != std::string::npos) GTEST_SKIP() << "no error feedback";
  // DGC's accumulator gathers the momentum u, not g (v' = v + u - sent): its invariant is not this one.
  if (GetParam().rfind("dgc", 0) == 0) GTEST_SKIP() << "dgc: momentum correction, not plain error feedback";
  const std::size_t n = 50000;
  auto* ef = dynamic_cast<ErrorFeedbackCompressor*>(gpu.get());
  ASSERT_NE(ef, nullptr);
  const float scale = parity::wire_scale(GetParam(), 1.0f);
  std::vector<float> residual_before(n, 0.0f);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto values = parity::random_values(n, static_cast<unsigned>(100 + step));
    DeviceArray<float> device(values);
    CompressContext ctx;
    ctx.name = "ef";
    ctx.step = step;
    const auto payload = payload_on_gpu(*gpu, device, 0, n, ctx);
    std::vector<float> decoded(n, 0.0f);
    gpu->decompress(payload, TensorView::of(std::span<float>(decoded)), DecodeMode::kOverwrite);
    const TensorState* state = ef->state_of("ef");
    ASSERT_NE(state, nullptr);
    ASSERT_EQ(state->buffers[0].size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const float sent = decoded[i] / scale;  // decoded values are in wire units (fp16:prescale=0.25)
      const float v = residual_before[i] + values[i];
      const float residual = state->buffers[0][i];
      ASSERT_NEAR(residual + sent, v, parity::ef_tolerance(residual, sent, v))
          << GetParam() << " index " << i << " step " << step;
    }
    residual_before = state->buffers[0];
  }
}

// nonfinite=raise leaves the state untouched; skip and pass give the CPU's payloads.
TEST_P(Parity, NonFinitePolicies) {
  const std::size_t n = 4099;
  for (const char* policy : {"raise", "skip", "pass"}) {
    const std::string spec = parity::with_param(GetParam(), std::string("nonfinite=") + policy);
    auto cpu = make_compressor(spec);
    auto gpu = make_compressor(spec);
    CompressContext ctx;
    ctx.name = "nf";
    auto values = parity::random_values(n, 5);
    DeviceArray<float> clean(values);
    const auto first_cpu = compress_to_vector(*cpu, TensorView::of(std::span<const float>(values)), ctx);
    ASSERT_EQ(payload_on_gpu(*gpu, clean, 0, n, ctx), first_cpu) << spec;
    const std::size_t nonfinite = parity::put_nonfinite(values);
    DeviceArray<float> dirty(values);
    ctx.step = 1;
    if (std::string(policy) == "raise") {
      const auto before = gpu->save_state();
      EXPECT_THROW(payload_on_gpu(*gpu, dirty, 0, n, ctx), InvalidArgument) << spec;
      EXPECT_EQ(gpu->save_state(), before) << spec << ": a rejected step changed the state";
      continue;
    }
    const auto expected = compress_to_vector(*cpu, TensorView::of(std::span<const float>(values)), ctx);
    EXPECT_EQ(payload_on_gpu(*gpu, dirty, 0, n, ctx), expected) << spec;
    EXPECT_EQ(gpu->last_stats().nonfinite, nonfinite);
    EXPECT_EQ(gpu->last_stats().skipped, cpu->last_stats().skipped);
    EXPECT_EQ(gpu->save_state(), cpu->save_state()) << spec;
  }
}

// Finite values whose f32 sums overflow (qsgd's l2 scale, terngrad's sigma, onebit's mean fall back to double
// sums on the CPU; lane 0 of the warp reproduces that): bit-identical payloads and state over two steps.
TEST_P(Parity, OverflowFallbacks) {
  const std::size_t n = 100003;
  auto cpu = make_compressor(GetParam());
  auto gpu = make_compressor(GetParam());
  const auto values = parity::overflow_values(n, 21);
  DeviceArray<float> device(values);
  CompressContext ctx;
  ctx.name = "o";
  for (std::uint64_t step = 0; step < 2; ++step) {
    ctx.step = step;
    const auto expected = compress_to_vector(*cpu, TensorView::of(std::span<const float>(values)), ctx);
    ASSERT_EQ(payload_on_gpu(*gpu, device, 0, n, ctx), expected) << GetParam() << " step " << step;
  }
  EXPECT_EQ(gpu->save_state(), cpu->save_state()) << GetParam();
}

// State moves between devices: GPU steps, save, load into a CPU compressor, which continues bit-identically.
TEST_P(Parity, StateRoundTripsBetweenGpuAndCpu) {
  const std::size_t n = 10007;
  auto gpu = make_compressor(GetParam());
  auto reference = make_compressor(GetParam());
  CompressContext ctx;
  ctx.name = "s";
  for (std::uint64_t step = 0; step < 2; ++step) {
    ctx.step = step;
    const auto values = parity::random_values(n, static_cast<unsigned>(step + 3));
    DeviceArray<float> device(values);
    payload_on_gpu(*gpu, device, 0, n, ctx);
    compress_to_vector(*reference, TensorView::of(std::span<const float>(values)), ctx);
  }
  auto resumed = make_compressor(GetParam());
  resumed->load_state(gpu->save_state());
  ctx.step = 2;
  const auto values = parity::random_values(n, 99);
  const auto a = compress_to_vector(*resumed, TensorView::of(std::span<const float>(values)), ctx);
  const auto b = compress_to_vector(*reference, TensorView::of(std::span<const float>(values)), ctx);
  EXPECT_EQ(a, b) << GetParam();
  // And the GPU instance itself, after its state was read back, continues on the CPU identically too.
  const auto c = compress_to_vector(*gpu, TensorView::of(std::span<const float>(values)), ctx);
  EXPECT_EQ(c, b) << GetParam();
}

// Every rank's payload of a gathered buffer in one decompress_sum: a device payload at an aligned address, one at an
// address 2 mod 16 (an odd top-k f16 payload puts the next one there), one in host memory. The sum equals the CPU's
// decode of each in turn, the host waits at most twice, and a corrupt last payload leaves the output untouched.
TEST_P(Parity, SumOfPayloadsMatchesTheCpu) {
  const std::size_t n = 30011;
  std::vector<std::vector<std::byte>> payloads;
  for (unsigned rank = 0; rank < 3; ++rank) {
    const auto values = parity::random_values(n, 31 + rank);
    CompressContext ctx;
    ctx.name = "t";
    ctx.prescale = 0.5f;
    auto encoder = make_compressor(GetParam());
    payloads.push_back(compress_to_vector(*encoder, TensorView::of(std::span<const float>(values)), ctx));
  }
  auto cpu = make_compressor(GetParam());
  std::vector<float> expected(n, 0.0f);
  for (std::size_t r = 0; r < payloads.size(); ++r) {
    cpu->decompress(payloads[r], TensorView::of(std::span<float>(expected)),
                    r == 0 ? DecodeMode::kOverwrite : DecodeMode::kAccumulate);
  }
  const std::size_t at1 = (payloads[0].size() + 15) / 16 * 16 + 2;
  std::vector<std::byte> gathered(at1 + payloads[1].size());
  std::memcpy(gathered.data(), payloads[0].data(), payloads[0].size());
  std::memcpy(gathered.data() + at1, payloads[1].data(), payloads[1].size());
  DeviceArray<std::byte> device(gathered);
  std::vector<PayloadBytes> spans = {
      PayloadBytes(std::span<const std::byte>(device.data(), payloads[0].size()), kOnGpu),
      PayloadBytes(std::span<const std::byte>(device.data() + at1, payloads[1].size()), kOnGpu),
      PayloadBytes(payloads[2])};
  auto gpu = make_compressor(GetParam());
  DeviceArray<float> out(std::vector<float>(n, 7.0f));
  const TensorView view(out.data(), n, DType::kF32, Device::cuda(0));
  const std::size_t waits_before = kernels::thread_usage().synchronizations;
  gpu->decompress_sum(spans, view, DecodeMode::kOverwrite);
  EXPECT_LE(kernels::thread_usage().synchronizations - waits_before, 2u) << GetParam();
  const auto got = out.download();
  ASSERT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0) << GetParam();

  // The last payload one byte short: CorruptPayload before any payload is written.
  std::vector<float> before = got;
  spans[2].bytes = spans[2].bytes.first(spans[2].bytes.size() - 1);
  EXPECT_THROW(gpu->decompress_sum(spans, view, DecodeMode::kAccumulate), CorruptPayload) << GetParam();
  EXPECT_EQ(out.download(), before) << GetParam() << ": a corrupt payload wrote into the output";
}

INSTANTIATE_TEST_SUITE_P(Codecs, Parity, ::testing::ValuesIn(parity::specs()), parity::test_name);

// Every registered codec has a CUDA path (fails, listing the ones that do not, until all do).
TEST(Coverage, EveryBuiltinCodecHasACudaPath) {
  std::vector<std::string> missing;
  std::vector<float> values(64, 1.0f);
  DeviceArray<float> device(values);
  for (const auto& info : default_registry().list()) {
    auto compressor = make_compressor(info.name);
    DeviceArray<std::byte> out(compressor->max_payload_bytes(values.size()));
    CompressContext ctx;
    ctx.name = "probe";
    try {
      compressor->compress(TensorView(device.data(), values.size(), DType::kF32, Device::cuda(0)),
                           std::span<std::byte>(out.data(), out.size()), ctx);
    } catch (const InvalidArgument& error) {
      if (std::string(error.what()).find("no CUDA path") != std::string::npos) missing.push_back(info.name);
    }
  }
  EXPECT_TRUE(missing.empty()) << "codecs without a CUDA path: " << ::testing::PrintToString(missing);
}

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
