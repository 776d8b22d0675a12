// device_path_bench: the fused Runtime on one rank's gradients, per spec: GB/s of gradient per step (gradient bytes /
// wall time of enqueue-all + synchronize), on CUDA tensors over a communicator that takes device memory (NCCL with
// one rank when the build has it, else the in-process backend behind testing::through_host), or on host tensors
// (--device cpu, runs anywhere). Also reports bytes staged through the host per step (0 on the device-resident
// path) and compares every result with the host path's bits on the same input (#wrong; exit 1 on any); on host
// tensors, where the host runtime is the path measured, with the codec alone instead (device_path_reference.h: each
// tensor compressed as if alone over the two steps, within the allreduce tests' bounds). The tensors
// are matrices (rows: the largest divisor of a tensor's size up to its square root) for the shape-aware codecs
// (powersgd); the others ignore the shape. A rounds codec (powersgd) on CUDA tensors multiplies with cuBLAS where
// the host uses its BLAS (another summation order): its results are compared within 1e-4 of each tensor's largest
// |value| instead of bit for bit (tests/gpu/powersgd_gpu_test.cc derives that bound).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/comm/device_path_reference.h"
#include "tests/comm/through_host.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"

#if GRADCOMP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gradcomp {
namespace {

struct Config {
  std::string device = "cuda";
  std::size_t numel = 25'000'000;
  std::size_t tensors = 50;
  int steps = 5;
  int warmup = 2;
  bool check = true;
  std::vector<std::string> specs = {"none", "fp16", "qsgd:bits=4", "topk:ratio=0.01", "dgc:ratio=0.001",
                                    "powersgd:rank=4"};
};

void usage() {
  std::puts(
      "usage: device_path_bench [options]\n"
      "  --device D     cuda (default) or cpu\n"
      "  --numel N      floats of gradient per step (default 25e6), split into --tensors T tensors (default 50)\n"
      "  --steps N      timed steps per spec (default 5) after --warmup N (default 2)\n"
      "  --spec S       compressor spec; repeat for several (default: none, fp16, qsgd:bits=4, topk:ratio=0.01,\n"
      "                 dgc:ratio=0.001, powersgd:rank=4)\n"
      "  --no-check     skip the comparison with the host path\n"
      "  -h, --help     this text\n"
      "Columns: device, comm, spec, numel, tensors, s/step, GB/s (gradient bytes per second), staged bytes/step,\n"
      "buffers/step, allocs (blocks of working memory obtained after the warm-up: 0 in steady state), #wrong (elements\n"
      "whose bits differ from the host runtime's on the same input; for a rounds codec such as powersgd on CUDA tensors,\n"
      "elements off by more than 1e-4 of their tensor's largest |value|; on --device cpu, elements off the codec's own\n"
      "result for each tensor alone, within the tests' bounds).\n"
      "Each tensor is a matrix of rows = the largest divisor of its size up to its square root.");
}

// Deterministic values in [-1, 1).
void fill(std::vector<float>& values, std::size_t seed) {
  std::uint32_t state = static_cast<std::uint32_t>(seed * 2654435761u + 1);
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<std::int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
}

// The first dimension the tensors of `numel` elements get: the largest divisor of numel up to its square root, or 0
// (a vector) when that is below 16, so that no codec rank up to 15 meets a matrix it must refuse (powersgd asks for
// rank < min(rows, cols)).
std::size_t rows_of(std::size_t numel) {
  std::size_t rows = 1;
  for (std::size_t d = 1; d * d <= numel; ++d) {
    if (numel % d == 0) rows = d;
  }
  return rows < 16 ? 0 : rows;
}

// True when the host and device paths of `spec` may differ within rounding (a rounds codec: BLAS vs cuBLAS).
bool compared_with_tolerance(const std::string& spec) {
  const ParsedSpec parsed = parse_spec(spec);
  return default_registry().contains(parsed.name) && default_registry().info(parsed.name).traits.rounds;
}

// One runtime run of `steps` steps over `tensors` (views); returns the seconds per step of the last `timed` steps.
double run_steps(Runtime& rt, const std::vector<TensorView>& views, const std::string& spec, int warmup, int timed) {
  double seconds = 0;
  for (int step = 0; step < warmup + timed; ++step) {  // timed 0: warm-up only (returns 0)
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t t = 0; t < views.size(); ++t) rt.allreduce_async(fmt::format("g{}", t), views[t], spec);
    rt.synchronize();
    if (step >= warmup) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return timed > 0 ? seconds / timed : 0.0;
}

int run(const Config& config) {
  auto comms = make_local_communicators(1);
  Communicator& world = *comms[0];
  std::unique_ptr<Communicator> device_comm;
  std::string comm_name = "local";
  const bool cuda = config.device == "cuda";
#if GRADCOMP_WITH_CUDA && GRADCOMP_WITH_NCCL
  if (cuda) {
    device_comm = make_nccl_communicator(world, 0);
    comm_name = "nccl";
  }
#endif
  if (cuda && !device_comm) {
    device_comm = testing::through_host(world);
    comm_name = "local+staging";
  }
  GRADCOMP_CHECK(!cuda || GRADCOMP_WITH_CUDA, "device_path_bench: --device cuda needs a CUDA build");
  const std::size_t per = (config.numel + config.tensors - 1) / config.tensors;
  std::vector<std::vector<float>> inputs(config.tensors);
  for (std::size_t t = 0; t < config.tensors; ++t) {
    inputs[t].resize(std::min(per, config.numel - std::min(config.numel, t * per)));
    fill(inputs[t], t);
  }
  std::printf("%-8s %-14s %-18s %10s %7s %9s %8s %12s %8s %7s %7s\n", "device", "comm", "spec", "numel", "tensors",
              "s/step", "GB/s", "staged/step", "buffers", "allocs", "#wrong");
  int wrong_total = 0;
  for (const std::string& spec : config.specs) {
    RuntimeOptions options;
    options.timeline_path = "";
    options.device_comm = device_comm.get();
    options.fusion_tensor_limit_bytes = 0;
    std::vector<std::vector<float>> host = inputs;
    std::vector<TensorView> views;
    std::vector<void*> device_memory;
    for (auto& values : host) {
      if (!cuda) {
        views.push_back(TensorView::of(std::span<float>(values)).with_rows(rows_of(values.size())));
        continue;
      }
#if GRADCOMP_WITH_CUDA
      void* data = nullptr;
      if (cudaMalloc(&data, values.size() * sizeof(float)) != cudaSuccess) throw CudaError("cudaMalloc failed");
      cudaMemcpy(data, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice);
      device_memory.push_back(data);
      views.push_back(TensorView(data, values.size(), DType::kF32, Device::cuda(0)).with_rows(rows_of(values.size())));
#endif
    }
    double seconds = 0;
    RuntimeStats stats;
    std::size_t warm_allocations = 0;  // working memory obtained after the warm-up steps (0 in steady state)
    {
      Runtime rt(world, options);  // shut down before the next runtime uses the communicator
      run_steps(rt, views, spec, config.warmup, 0);
      const std::size_t after_warmup = rt.stats().allocations;
      seconds = run_steps(rt, views, spec, 0, config.steps);
      stats = rt.stats();
      warm_allocations = stats.allocations - after_warmup;
    }
    const int steps = config.warmup + config.steps;
    long long wrong = -1;
    if (config.check) {
      // Fresh inputs, two steps through this path and through a host runtime, with long cycles so that both group
      // the tensors alike (the grouping decides a sparsifier's selection); a pair of runs whose groupings still
      // differ (a loaded machine can split a step over two cycles) is repeated. Then every bit must agree.
      RuntimeOptions check_options = options;
      check_options.cycle_time_ms = 50;
      check_options.idle_cycle_max_ms = 0;
      std::vector<std::vector<float>> reference;
      for (int attempt = 0; attempt < 5; ++attempt) {
        reference = inputs;
        for (std::size_t t = 0; t < views.size(); ++t) {
          host[t] = inputs[t];
#if GRADCOMP_WITH_CUDA
          if (cuda) {
            cudaMemcpy(device_memory[t], host[t].data(), host[t].size() * sizeof(float), cudaMemcpyHostToDevice);
          }
#endif
        }
        auto grouping = [&](Runtime& rt, const std::vector<TensorView>& of) {
          run_steps(rt, of, spec, 0, 2);
          std::vector<std::size_t> sizes;
          for (const BufferRecord& buffer : rt.stats().buffers) sizes.push_back(buffer.tensors);
          return sizes;
        };
        std::vector<std::size_t> tested, expected;
        {
          Runtime rt(world, check_options);
          tested = grouping(rt, views);
        }
        std::vector<TensorView> reference_views;
        for (auto& values : reference) {
          reference_views.push_back(TensorView::of(std::span<float>(values)).with_rows(rows_of(values.size())));
        }
        RuntimeOptions host_options = check_options;
        host_options.device_comm = nullptr;
        {
          Runtime reference_rt(world, host_options);
          expected = grouping(reference_rt, reference_views);
        }
        if (tested == expected) break;
      }
      wrong = 0;
      const bool tolerance = cuda && compared_with_tolerance(spec);
      if (!cuda) {
        // Host tensors: the host runtime is the path under test, so the reference is the codec alone.
        std::vector<std::size_t> rows;
        for (const auto& values : inputs) rows.push_back(rows_of(values.size()));
        const auto expected_values = bench::one_rank_reference(spec, inputs, rows);
        for (std::size_t t = 0; t < views.size(); ++t) {
          wrong += static_cast<long long>(
              testing::count_outside(host[t], expected_values[t].values, expected_values[t].bounds));
        }
      }
      for (std::size_t t = 0; cuda && t < views.size(); ++t) {
        std::vector<float> got(host[t].size());
#if GRADCOMP_WITH_CUDA
        cudaMemcpy(got.data(), device_memory[t], got.size() * sizeof(float), cudaMemcpyDeviceToHost);
#endif
        if (tolerance) {
          double largest = 0;
          for (float v : reference[t]) largest = std::max(largest, std::fabs(static_cast<double>(v)));
          for (std::size_t i = 0; i < got.size(); ++i) {
            // Written so that NaN counts as wrong.
            wrong += !(std::fabs(static_cast<double>(got[i]) - reference[t][i]) <= 1e-4 * largest);
          }
          continue;
        }
        for (std::size_t i = 0; i < got.size(); ++i) {
          wrong += std::memcmp(&got[i], &reference[t][i], sizeof(float)) != 0;
        }
      }
      wrong_total += wrong > 0;
    }
#if GRADCOMP_WITH_CUDA
    for (void* data : device_memory) cudaFree(data);
#endif
    std::printf("%-8s %-14s %-18s %10zu %7zu %9.4f %8.2f %12zu %8.1f %7zu %7lld\n", config.device.c_str(),
                cuda ? comm_name.c_str() : "local", spec.c_str(), config.numel, config.tensors, seconds,
                static_cast<double>(config.numel * sizeof(float)) / seconds / 1e9, stats.staged_bytes / steps,
                static_cast<double>(stats.messages) / steps, warm_allocations, wrong);
  }
  return wrong_total > 0 ? 1 : 0;
}

}  // namespace
}  // namespace gradcomp

int main(int argc, char** argv) {
  gradcomp::Config config;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto next = [&]() -> std::string {
        GRADCOMP_CHECK(i + 1 < argc, "device_path_bench: {} needs a value (see --help)", arg);
        return argv[++i];
      };
      if (arg == "-h" || arg == "--help") {
        gradcomp::usage();
        return 0;
      } else if (arg == "--device") {
        config.device = next();
        GRADCOMP_CHECK(config.device == "cuda" || config.device == "cpu", "--device must be cuda or cpu");
      } else if (arg == "--numel") {
        config.numel = static_cast<std::size_t>(std::stod(next()));
      } else if (arg == "--tensors") {
        config.tensors = std::stoul(next());
      } else if (arg == "--steps") {
        config.steps = std::stoi(next());
      } else if (arg == "--warmup") {
        config.warmup = std::stoi(next());
      } else if (arg == "--spec") {
        static bool first = true;
        if (first) config.specs.clear();
        first = false;
        config.specs.push_back(next());
      } else if (arg == "--no-check") {
        config.check = false;
      } else {
        throw gradcomp::InvalidArgument(fmt::format("device_path_bench: unknown option '{}' (see --help)", arg));
      }
    }
    GRADCOMP_CHECK(config.tensors > 0 && config.steps > 0 && config.numel >= config.tensors,
                   "device_path_bench: need numel >= tensors > 0 and steps > 0");
    return gradcomp::run(config);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 2;
  }
}
