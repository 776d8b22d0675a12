// fusion_bench: the runtime with tensor fusion against the same runtime without it (fusion threshold 0), under
// mpirun. Per workload and spec: wall time of one step (enqueue every gradient in backward order, synchronize; max
// over ranks, mean over steps), data messages per step, wire bytes, and a correctness check of every element for
// summable codecs (#wrong; exit 1 on any). Workloads: small (200 x 10 KB), resnet50 (ResNet-50's 161 parameter
// tensors, 256 B .. 9.4 MB, 102 MB).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"

namespace gradcomp {
namespace {

struct Config {
  std::vector<std::string> workloads = {"small", "resnet50"};
  std::vector<std::string> specs = {"none", "topk:ratio=0.01"};
  int steps = 3;
  int warmup = 1;
  std::size_t threshold = std::size_t{64} << 20;
  std::size_t tensor_limit = default_fusion_tensor_limit();
  double cycle_ms = 1.0;
  double timeout_s = 600;
  bool json = false;
  bool breakdown = false;
};

void usage() {
  std::puts(
      "usage: mpirun -np N fusion_bench [options]\n"
      "  --workload W   small (200 x 10 KB) | resnet50 (161 tensors, 256 B..9.4 MB, 102 MB) | all (default)\n"
      "  --spec S       compressor spec; repeat for several (default: none and topk:ratio=0.01)\n"
      "  --steps N      timed steps per row (default 3), after --warmup N untimed steps (default 1)\n"
      "  --threshold B  fusion threshold of the fused run, bytes (default 64 MiB; the unfused run uses 0)\n"
      "  --tensor-limit B  largest tensor copied into a fusion buffer, bytes (default: the runtime's, 1 MiB; 0 = no limit)\n"
      "  --cycle-ms T   negotiation cycle time (default 1)\n"
      "  --timeout S    communicator timeout, seconds (default 600)\n"
      "  --json         one JSON object per row\n"
      "  --breakdown    per-phase seconds per step of every run on stderr (from the runtime's stats)\n"
      "  -h, --help     this text\n"
      "Columns: workload, spec, ranks, tensors, bytes, fused_s, unfused_s, speedup (unfused/fused), fused_messages,\n"
      "unfused_messages (data messages per step), fused_wire_bytes, unfused_wire_bytes (per step, rank 0), wrong\n"
      "(elements off the exact average, summable codecs only; -1 = not checked). Exit status 1 on wrong elements.");
}

// Element counts of ResNet-50's parameters in definition order (conv weight, bn weight, bn bias, ...).
std::vector<std::size_t> resnet50_sizes() {
  std::vector<std::size_t> sizes = {64 * 3 * 7 * 7, 64, 64};
  const int blocks[4] = {3, 4, 6, 3};
  std::size_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::size_t width = std::size_t{64} << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      sizes.insert(sizes.end(), {in * width, width, width, width * width * 9, width, width, width * width * 4,
                                 width * 4, width * 4});
      if (b == 0) sizes.insert(sizes.end(), {in * width * 4, width * 4, width * 4});
      in = width * 4;
    }
  }
  sizes.insert(sizes.end(), {2048 * 1000, 1000});
  return sizes;
}

std::vector<std::size_t> workload_sizes(const std::string& workload) {
  if (workload == "small") return std::vector<std::size_t>(200, 2560);
  if (workload == "resnet50") return resnet50_sizes();
  throw InvalidArgument(fmt::format("unknown workload '{}' (valid: small, resnet50, all)", workload));
}

// Exactly representable values whose average over a power-of-two or any rank count is checked with a tolerance of 0.
float value_of(int rank, std::size_t tensor, std::size_t i) {
  return static_cast<float>(rank + 1) * 0.25f + static_cast<float>((tensor + i) % 8);
}

struct Run {
  double step_s = 0;
  double messages = 0;
  double wire_bytes = 0;
  long long wrong = 0;
};

float max_over_ranks(Communicator& comm, float value) {
  comm.allreduce(TensorView(&value, 1, DType::kF32), ReduceOp::kMax);
  return value;
}

// `comm` carries the runtime's traffic; `control` (a duplicate) the bench's own barriers and maxima, since a
// communicator is used by one thread at a time and the runtime's thread owns `comm` while it runs.
Run run_once(Communicator& comm, Communicator& control, const Config& config, const std::vector<std::size_t>& sizes,
             const std::string& spec, std::size_t threshold, bool check) {
  const int n = comm.size();
  std::vector<std::vector<float>> grads(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) grads[t].resize(sizes[t]);
  Run run;
  {
    RuntimeOptions options;
    options.fusion_threshold_bytes = threshold;
    options.fusion_tensor_limit_bytes = config.tensor_limit;
    options.cycle_time_ms = config.cycle_ms;
    Runtime rt(comm, options);
    double total = 0;
    for (int step = 0; step < config.warmup + config.steps; ++step) {
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (std::size_t i = 0; i < sizes[t]; ++i) grads[t][i] = value_of(comm.rank(), t, i);
      }
      if (step == config.warmup) rt.take_stats();
      control.barrier();
      const auto start = std::chrono::steady_clock::now();
      // Backward order: the last layer's gradient is ready first.
      for (std::size_t k = sizes.size(); k-- > 0;) {
        rt.allreduce_async(fmt::format("param{}", k), TensorView::of(std::span<float>(grads[k])), spec);
      }
      rt.synchronize();
      const float seconds = std::chrono::duration<float>(std::chrono::steady_clock::now() - start).count();
      if (step >= config.warmup) total += max_over_ranks(control, seconds);
      if (check && step == config.warmup + config.steps - 1) {
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          for (std::size_t i = 0; i < sizes[t]; ++i) {
            float expected = 0;
            for (int r = 0; r < n; ++r) expected += value_of(r, t, i);
            expected /= static_cast<float>(n);
            if (std::abs(grads[t][i] - expected) > 1e-5f * std::max(1.0f, std::abs(expected))) ++run.wrong;
          }
        }
      }
    }
    const RuntimeStats stats = rt.take_stats();
    if (config.breakdown && comm.rank() == 0) {
      fmt::print(stderr,
                 "# {} threshold {}: per step negotiate {:.4f} s ({} cycles), queue (sum over tensors) {:.4f} s, "
                 "copy_in {:.4f}, compress {:.4f}, communicate {:.4f}, decompress {:.4f}, copy_out {:.4f}\n",
                 spec, threshold, stats.negotiate_s / config.steps, stats.cycles / config.steps,
                 stats.queue_s / config.steps, stats.copy_in_s / config.steps, stats.compress_s / config.steps,
                 stats.communicate_s / config.steps, stats.decompress_s / config.steps,
                 stats.copy_out_s / config.steps);
    }
    run.step_s = total / config.steps;
    run.messages = static_cast<double>(stats.messages) / config.steps;
    run.wire_bytes = static_cast<double>(stats.wire_bytes) / config.steps;
    rt.shutdown();
  }
  if (!check) run.wrong = -1;
  return run;
}

int run_all(Communicator& comm, const Config& config) {
  const bool root = comm.rank() == 0;
  const auto control = comm.split(0, comm.rank());
  if (root && !config.json) {
    fmt::print("# fusion_bench: {} ranks ({}), steps {} (+{} warm-up), fused threshold {} B, tensor limit {} B, "
               "cycle {} ms\n",
               comm.size(), comm.backend(), config.steps, config.warmup, config.threshold, config.tensor_limit,
               config.cycle_ms);
    fmt::print("{:>9} {:>18} {:>5} {:>7} {:>11} {:>10} {:>10} {:>8} {:>9} {:>9} {:>12} {:>12} {:>6}\n", "workload",
               "spec", "ranks", "tensors", "bytes", "fused_s", "unfused_s", "speedup", "fused_msg", "unfus_msg",
               "fused_wire", "unfused_wire", "#wrong");
  }
  int bad = 0;
  for (const auto& workload : config.workloads) {
    const auto sizes = workload_sizes(workload);
    std::size_t bytes = 0;
    for (std::size_t s : sizes) bytes += s * sizeof(float);
    for (const auto& spec : config.specs) {
      const bool check = make_compressor(spec)->traits().summable && !make_compressor(spec)->traits().lossy;
      const Run fused = run_once(comm, *control, config, sizes, spec, config.threshold, check);
      const Run unfused = run_once(comm, *control, config, sizes, spec, 0, check);
      const long long wrong = check ? fused.wrong + unfused.wrong : -1;
      bad += wrong > 0;
      const double speedup = fused.step_s > 0 ? unfused.step_s / fused.step_s : 0;
      if (!root) continue;
      if (config.json) {
        fmt::print("{{\"workload\": \"{}\", \"spec\": \"{}\", \"ranks\": {}, \"tensors\": {}, \"bytes\": {}, "
                   "\"fused_s\": {:.6g}, \"unfused_s\": {:.6g}, \"speedup\": {:.4g}, \"fused_messages\": {:.4g}, "
                   "\"unfused_messages\": {:.4g}, \"fused_wire_bytes\": {:.0f}, \"unfused_wire_bytes\": {:.0f}, "
                   "\"wrong\": {}}}\n",
                   workload, spec, comm.size(), sizes.size(), bytes, fused.step_s, unfused.step_s, speedup,
                   fused.messages, unfused.messages, fused.wire_bytes, unfused.wire_bytes, wrong);
      } else {
        fmt::print("{:>9} {:>18} {:>5} {:>7} {:>11} {:>10.5f} {:>10.5f} {:>8.2f} {:>9.1f} {:>9.1f} {:>12.0f} {:>12.0f} "
                   "{:>6}\n",
                   workload, spec, comm.size(), sizes.size(), bytes, fused.step_s, unfused.step_s, speedup,
                   fused.messages, unfused.messages, fused.wire_bytes, unfused.wire_bytes, wrong);
      }
      std::fflush(stdout);
    }
  }
  return bad;
}

}  // namespace
}  // namespace gradcomp

int main(int argc, char** argv) {
  using namespace gradcomp;
  try {
    Config config;
    std::vector<std::string> specs;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        GRADCOMP_CHECK(i + 1 < argc, "option {} needs a value (see --help)", arg);
        return argv[++i];
      };
      if (arg == "-h" || arg == "--help") {
        usage();
        return 0;
      } else if (arg == "--workload") {
        const std::string w = value();
        config.workloads = w == "all" ? std::vector<std::string>{"small", "resnet50"} : std::vector<std::string>{w};
      } else if (arg == "--spec") {
        specs.push_back(value());
      } else if (arg == "--steps") {
        config.steps = std::stoi(value());
      } else if (arg == "--warmup") {
        config.warmup = std::stoi(value());
      } else if (arg == "--threshold") {
        config.threshold = std::stoull(value());
      } else if (arg == "--tensor-limit") {
        config.tensor_limit = std::stoull(value());
      } else if (arg == "--cycle-ms") {
        config.cycle_ms = std::stod(value());
      } else if (arg == "--timeout") {
        config.timeout_s = std::stod(value());
      } else if (arg == "--breakdown") {
        config.breakdown = true;
      } else if (arg == "--json") {
        config.json = true;
      } else {
        throw InvalidArgument(fmt::format("unknown option '{}' (see --help)", arg));
      }
    }
    if (!specs.empty()) config.specs = specs;
    GRADCOMP_CHECK(config.steps > 0 && config.warmup >= 0, "--steps must be > 0 and --warmup >= 0");
    for (const auto& w : config.workloads) workload_sizes(w);
    for (const auto& s : config.specs) make_compressor(s);
    MpiOptions mpi;
    mpi.timeout = std::chrono::milliseconds(static_cast<long long>(config.timeout_s * 1000));
    auto comm = make_mpi_world_communicator(mpi);
    const int bad = run_all(*comm, config);
    return bad > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_bench: %s\n", e.what());
    return 2;
  }
}
