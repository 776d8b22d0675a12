// What a tensor receives from the runtime depends on nothing but its own inputs: not on which tensors shared its
// fusion buffer, the fusion threshold, the cycle time or arrival timing (fusion-invariant compression), and not on
// what other owners (scopes) submit beside it in the same process. Bad input costs only itself.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "kernels/cuda_device.h"
#include "tests/comm/local_harness.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

const char* const kEveryCodec[] = {"none", "fp16", "bf16", "qsgd:bits=4", "terngrad", "onebit", "topk:ratio=0.05",
                                   "randomk:ratio=0.1", "blocktopk:ratio=0.1,block=16",
                                   "dgc:ratio=0.05,warmup_steps=1", "powersgd:rank=2"};
const std::vector<std::size_t> kSizes = {1, 1000, 3, 7000, 257, 4096, 12, 600};

struct Config {
  std::size_t threshold;
  double cycle_ms;
  bool shuffled;  // each rank submits in its own random order, with pauses (arrivals spread over cycles)
};

// Runs `steps` steps of every tensor of kSizes (a matrix of 8 rows where it divides, for PowerSGD) and returns the
// results of all steps, bit for bit.
std::vector<std::vector<std::uint32_t>> run(Communicator& comm, const std::string& spec, const Config& config,
                                            int steps) {
  RuntimeOptions options;
  options.fusion_threshold_bytes = config.threshold;
  options.cycle_time_ms = config.cycle_ms;
  options.timeline_path = "";
  Runtime rt(comm, options);
  std::vector<std::vector<std::uint32_t>> out;
  std::mt19937 order_rng(99 + comm.rank());
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> data(kSizes.size());
    std::mt19937 rng(7 + 1000 * comm.rank() + step);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t t = 0; t < kSizes.size(); ++t) {
      data[t].resize(kSizes[t]);
      for (float& v : data[t]) v = normal(rng);
    }
    std::vector<std::size_t> order(kSizes.size());
    for (std::size_t t = 0; t < order.size(); ++t) order[t] = t;
    if (config.shuffled) std::shuffle(order.begin(), order.end(), order_rng);
    for (std::size_t t : order) {
      TensorView view = TensorView::of(std::span<float>(data[t]));
      if (kSizes[t] % 8 == 0) view = view.with_rows(8);
      rt.allreduce_async(fmt::format("layer{}", t), view, spec);
      if (config.shuffled && t % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    rt.synchronize();
    for (const auto& tensor : data) {
      std::vector<std::uint32_t> bits(tensor.size());
      for (std::size_t i = 0; i < tensor.size(); ++i) bits[i] = std::bit_cast<std::uint32_t>(tensor[i]);
      out.push_back(std::move(bits));
    }
  }
  return out;
}

class FusionInvariance : public ::testing::TestWithParam<int> {};

TEST_P(FusionInvariance, EveryCodecGivesEachTensorTheSameBitsFusedOrNot) {
  const int ranks = GetParam();
  const Config configs[] = {{std::size_t{64} << 20, 1, false},  // everything fused
                            {0, 1, false},                      // nothing fused
                            {std::size_t{64} << 20, 50, true},  // 50 ms cycles, shuffled arrivals
                            {20000, 1, true}};                  // a small threshold: other groupings
  for (const char* spec : kEveryCodec) {
    SCOPED_TRACE(spec);
    run_ranks(ranks, [&](Communicator& comm) {
      const auto reference = run(comm, spec, configs[0], 3);
      for (std::size_t c = 1; c < std::size(configs); ++c) {
        const auto other = run(comm, spec, configs[c], 3);
        ASSERT_EQ(other.size(), reference.size());
        for (std::size_t t = 0; t < reference.size(); ++t) {
          ASSERT_EQ(other[t], reference[t]) << "config " << c << ", tensor " << t % kSizes.size() << " at step "
                                            << t / kSizes.size() << " on rank " << comm.rank();
        }
      }
      // Run to run: the same inputs give the same bits.
      ASSERT_EQ(run(comm, spec, configs[2], 3), run(comm, spec, configs[2], 3));
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, FusionInvariance, ::testing::Values(2, 4));

// Two owners (say a GAN's generator and discriminator optimizers) with the same parameter names, each with its own
// compressor and scope, in one runtime: the generator's results are those of the generator alone.
TEST(Scopes, AnOwnerBesideAnotherGetsTheBitsItGetsAlone) {
  for (const char* spec : {"topk:ratio=0.1", "dgc:ratio=0.05", "qsgd:bits=4", "fp16", "randomk:ratio=0.1"}) {
    SCOPED_TRACE(spec);
    run_ranks(2, [&](Communicator& comm) {
      auto steps = [&](bool with_other) {
        Runtime rt(comm, RuntimeOptions{});
        auto generator = make_compressor(spec);
        auto discriminator = make_compressor(spec);
        std::vector<std::uint32_t> bits;
        for (std::uint64_t step = 0; step < 4; ++step) {
          std::vector<std::vector<float>> g(2), d(2);
          for (int t = 0; t < 2; ++t) {
            g[t].assign(300 + 100 * t, 0.0f);
            d[t].assign(300 + 100 * t, 0.0f);
            for (std::size_t i = 0; i < g[t].size(); ++i) {
              g[t][i] = std::sin(0.37f * static_cast<float>(i + 13 * step + 101 * comm.rank() + t));
              d[t][i] = 5.0f * std::cos(0.11f * static_cast<float>(i * (t + 2) + step + comm.rank()));
            }
          }
          for (int t = 0; t < 2; ++t) {
            const std::string name = t == 0 ? "0.weight" : "0.bias";
            rt.allreduce_async(name, TensorView::of(std::span<float>(g[t])),
                               SubmitOptions{.compressor = generator.get(), .scope = "G", .step = step});
            if (with_other) {
              rt.allreduce_async(name, TensorView::of(std::span<float>(d[t])),
                                 SubmitOptions{.compressor = discriminator.get(), .scope = "D", .step = step});
            }
          }
          rt.synchronize();
          for (const auto& tensor : g) {
            for (float v : tensor) bits.push_back(std::bit_cast<std::uint32_t>(v));
          }
        }
        return std::make_pair(bits, generator->save_state());
      };
      const auto alone = steps(false);
      const auto beside = steps(true);
      ASSERT_EQ(beside.first, alone.first) << "the generator's results changed beside the discriminator";
      ASSERT_EQ(beside.second, alone.second) << "the generator's compressor state changed";
    });
  }
}

TEST(Scopes, OneCompressorPerScopeAndAScopeForEveryCallersCompressor) {
  run_ranks(1, [&](Communicator& comm) {
    Runtime rt(comm, RuntimeOptions{});
    auto a = make_compressor("topk"), b = make_compressor("topk");
    std::vector<float> x(10, 1.0f), y(10, 1.0f);
    EXPECT_THROW(rt.allreduce_async("x", TensorView::of(std::span<float>(x)), SubmitOptions{.compressor = a.get()}),
                 InvalidArgument);
    rt.allreduce_async("x", TensorView::of(std::span<float>(x)), SubmitOptions{.compressor = a.get(), .scope = "s"});
    try {
      rt.allreduce_async("y", TensorView::of(std::span<float>(y)), SubmitOptions{.compressor = b.get(), .scope = "s"});
      ADD_FAILURE() << "a second compressor for one scope was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("scope 's'"), std::string::npos) << e.what();
    }
    rt.synchronize();
  });
}

// A tensor labelled CUDA on a machine (or build) without a usable CUDA device is refused at submission, naming it and
// the rank, and the runtime keeps serving CPU tensors.
TEST(BadInput, ACudaTensorWithoutADeviceIsRefusedAndTheRuntimeGoesOn) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the tensor would be served";
  run_ranks(2, [&](Communicator& comm) {
    Runtime rt(comm, RuntimeOptions{});
    std::vector<float> host(64, 1.0f);
    const TensorView labelled(host.data(), host.size(), DType::kF32, Device::cuda(0));
    try {
      rt.allreduce_async("gpu.weight", labelled);
      ADD_FAILURE() << "a CUDA-labelled tensor was accepted";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("gpu.weight"), std::string::npos) << message;
      EXPECT_NE(message.find(fmt::format("rank {}", comm.rank())), std::string::npos) << message;
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<float> x(100, static_cast<float>(comm.rank() + 1));
      rt.wait(rt.allreduce_async("cpu.weight", TensorView::of(std::span<float>(x)), "none"));
      EXPECT_FLOAT_EQ(x[0], 1.5f);
    }
  });
}

TEST(BadInput, TheInt32IndexGuardNamesTheTensor) {
  run_ranks(1, [&](Communicator& comm) {
    Runtime rt(comm, RuntimeOptions{});
    float dummy = 0.0f;  // never read: the tensor is refused before anything touches it
    const TensorView huge(&dummy, (std::size_t{1} << 31) + 8, DType::kF32);
    try {
      rt.allreduce_async("embedding.weight", huge, "topk:ratio=0.01");
      ADD_FAILURE() << "a tensor past int32 indices was accepted";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("embedding.weight"), std::string::npos) << message;
      EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
      EXPECT_NE(message.find("int32"), std::string::npos) << message;
    }
    std::vector<float> x(10, 2.0f);
    rt.wait(rt.allreduce_async("small", TensorView::of(std::span<float>(x)), "topk:ratio=0.5"));
  });
}

// An error of a buffer's own work (here a NaN under nonfinite=raise on every rank) fails that buffer's tensors and
// nothing else: the next steps run.
TEST(BadInput, ABufferErrorFailsItsTensorsAloneAndTheRuntimeGoesOn) {
  for (const std::size_t threshold : {std::size_t{0}, std::size_t{64} << 20}) {
    run_ranks(2, [&](Communicator& comm) {
      RuntimeOptions options;
      options.fusion_threshold_bytes = threshold;
      Runtime rt(comm, options);
      std::vector<float> bad(50, 1.0f), good(50, 1.0f);
      bad[7] = std::nanf("");
      const Handle hb = rt.allreduce_async("bad", TensorView::of(std::span<float>(bad)), "qsgd");
      const Handle hg = rt.allreduce_async("good", TensorView::of(std::span<float>(good)), "qsgd");
      EXPECT_THROW(rt.wait(hb), InvalidArgument);
      try {
        rt.wait(hg);  // alone it succeeds; fused with "bad" it shares the buffer's error
        EXPECT_EQ(threshold, 0u);
      } catch (const InvalidArgument&) {
        EXPECT_NE(threshold, 0u) << "an unfused tensor failed with its neighbour's error";
      }
      for (int step = 0; step < 2; ++step) {
        std::vector<float> x(100, static_cast<float>(comm.rank()));
        rt.wait(rt.allreduce_async("later", TensorView::of(std::span<float>(x)), "none"));
        EXPECT_FLOAT_EQ(x[3], 0.5f);
      }
    });
  }
}

}  // namespace
}  // namespace gradcomp
