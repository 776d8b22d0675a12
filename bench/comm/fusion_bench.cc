// fusion_bench: the runtime with tensor fusion against the same runtime without it (fusion threshold 0), under
// mpirun. Per workload and spec: wall time of one step (enqueue every gradient in backward order, synchronize; max
// over ranks, mean over steps), data messages and control rounds per step, wire bytes, bytes copied into and out of
// fusion buffers, and a correctness check of every element for summable codecs (#wrong; exit 1 on any). Workloads:
// small (200 x 10 KB), resnet50 (ResNet-50's 161 parameter tensors, 256 B .. 9.4 MB, 102 MB).
//
// Latency model. Loopback has no per-message latency to speak of (the measured cost of one small allreduce is
// printed first). Each row's "model" line adds what a link latency alpha would cost, alpha-beta style, from the
// measured counts per step: every data message (any algorithm: a ring allreduce, an allgather of sizes + an
// allgatherv, an alltoallv + an allgatherv) pays 2(n-1) alpha, every control round (one allgather) n-1 alpha.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
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
  int lanes = default_pipeline_lanes();
  bool gather = default_fusion_gather();
  std::string mode = "both";
  int local_ranks = 0;  // > 0: that many ranks as threads of this process (comm/local), no mpirun
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
      "  --lanes N      pipeline lanes of both runs (default: the runtime's, 2; 0 = unpipelined)\n"
      "  --no-gather    fused none/fp16/bf16 buffers copy their members in and out (RuntimeOptions::fusion_gather)\n"
      "  --mode M       both (default) | fused | unfused: run only one side (e.g. under a profiler)\n"
      "  --local N      N ranks as threads of this process (comm/local) instead of mpirun: the runtime's own\n"
      "                 cost without a network, e.g. under valgrind --tool=callgrind\n"
      "  --timeout S    communicator timeout, seconds (default 600)\n"
      "  --json         one JSON object per row\n"
      "  --breakdown    per-phase seconds per step of every run on stderr (from the runtime's stats)\n"
      "  -h, --help     this text\n"
      "Columns: workload, spec, ranks, tensors, bytes, fused_s, unfused_s, speedup (unfused/fused), fused_messages,\n"
      "unfused_messages (data messages per step), fused_wire_bytes, unfused_wire_bytes (per step, rank 0), wrong\n"
      "(elements off the exact average, summable codecs only; -1 = not checked), then per step: control rounds,\n"
      "copied bytes (into and out of fusion buffers). Each row is followed by a model line: the step with 25 us and\n"
      "100 us of latency per message hop added (see the source). Exit status 1 on wrong elements.");
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
  double control_rounds = 0;  // negotiation collectives per step
  double copy_bytes = 0;      // bytes copied into and out of fusion buffers per step
  long long wrong = 0;
};

// Seconds per step that a latency of `alpha` seconds per message hop would add to `run` on `n` ranks.
double latency_model(const Run& run, int n, double alpha) {
  return alpha * (2.0 * (n - 1) * run.messages + (n - 1) * run.control_rounds);
}

// Median seconds of one 4-byte allreduce on `comm` (the per-message cost of this link), over 50 after 5 warm-up.
double message_cost(Communicator& comm) {
  float value = 1.0f;
  std::vector<double> times;
  for (int i = 0; i < 55; ++i) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    comm.allreduce(TensorView(&value, 1, DType::kF32), ReduceOp::kSum);
    if (i >= 5) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  float median = static_cast<float>(times[times.size() / 2]);
  comm.allreduce(TensorView(&median, 1, DType::kF32), ReduceOp::kMax);
  return median;
}

float max_over_ranks(Communicator& comm, float value) {
  comm.allreduce(TensorView(&value, 1, DType::kF32), ReduceOp::kMax);
  return value;
}

// Per step, on stderr: where the time went (rank 0's stats), per cycle, and the counters.
void print_breakdown(const RuntimeStats& stats, const std::string& spec, std::size_t threshold, int steps) {
  const double cycles = std::max<double>(1.0, static_cast<double>(stats.cycles));
  fmt::print(stderr,
             "# {} threshold {}: per step {:.1f} cycles ({:.1f} busy), {:.1f} control rounds ({:.0f} B sent), "
             "negotiate {:.1f} us/cycle; per step copy_in {:.4f} s, compress {:.4f}, communicate {:.4f}, decompress "
             "{:.4f}, copy_out {:.4f}, queue (sum over tensors) {:.4f}; copied {:.0f} B, gathered {:.0f} B, alone "
             "{:.0f} B, {:.1f} messages\n",
             spec, threshold, stats.cycles / double(steps), stats.busy_cycles / double(steps),
             stats.negotiation_collectives / double(steps), stats.negotiation_bytes / double(steps),
             1e6 * stats.negotiate_s / cycles, stats.copy_in_s / steps, stats.compress_s / steps,
             stats.communicate_s / steps, stats.decompress_s / steps, stats.copy_out_s / steps, stats.queue_s / steps,
             stats.copy_bytes / double(steps), stats.gathered_bytes / double(steps), stats.alone_bytes / double(steps),
             stats.messages / double(steps));
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
    options.pipeline_lanes = config.lanes;
    options.fusion_gather = config.gather;
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
    if (config.breakdown && comm.rank() == 0) print_breakdown(stats, spec, threshold, config.steps);
    run.step_s = total / config.steps;
    run.messages = static_cast<double>(stats.messages) / config.steps;
    run.wire_bytes = static_cast<double>(stats.wire_bytes) / config.steps;
    run.control_rounds = static_cast<double>(stats.negotiation_collectives) / config.steps;
    run.copy_bytes = static_cast<double>(stats.copy_bytes) / config.steps;
    rt.shutdown();
  }
  if (!check) run.wrong = -1;
  return run;
}

// The row's speedup with `alpha` seconds of latency per message hop added to both runs.
double modeled_speedup(const Run& fused, const Run& unfused, int n, double alpha) {
  const double f = fused.step_s + latency_model(fused, n, alpha);
  return f > 0 ? (unfused.step_s + latency_model(unfused, n, alpha)) / f : 0;
}

void print_row(const std::string& workload, const std::string& spec, int n, std::size_t tensors, std::size_t bytes,
               const Run& fused, const Run& unfused, long long wrong, const Config& config) {
  const double speedup = fused.step_s > 0 ? unfused.step_s / fused.step_s : 0;
  if (config.json) {
    fmt::print("{{\"workload\": \"{}\", \"spec\": \"{}\", \"ranks\": {}, \"lanes\": {}, \"tensors\": {}, "
               "\"bytes\": {}, \"fused_s\": {:.6g}, \"unfused_s\": {:.6g}, \"speedup\": {:.4g}, "
               "\"fused_messages\": {:.4g}, \"unfused_messages\": {:.4g}, \"fused_wire_bytes\": {:.0f}, "
               "\"unfused_wire_bytes\": {:.0f}, \"fused_control_rounds\": {:.4g}, \"unfused_control_rounds\": {:.4g}, "
               "\"fused_copy_bytes\": {:.0f}, \"unfused_copy_bytes\": {:.0f}, \"model_25us_speedup\": {:.4g}, "
               "\"model_100us_speedup\": {:.4g}, \"wrong\": {}}}\n",
               workload, spec, n, config.lanes, tensors, bytes, fused.step_s, unfused.step_s, speedup,
               fused.messages, unfused.messages, fused.wire_bytes, unfused.wire_bytes, fused.control_rounds,
               unfused.control_rounds, fused.copy_bytes, unfused.copy_bytes,
               modeled_speedup(fused, unfused, n, 25e-6), modeled_speedup(fused, unfused, n, 100e-6), wrong);
    return;
  }
  fmt::print("{:>9} {:>18} {:>5} {:>7} {:>11} {:>10.5f} {:>10.5f} {:>8.2f} {:>9.1f} {:>9.1f} {:>12.0f} {:>12.0f} "
             "{:>6} {:>7.1f} {:>7.1f} {:>10.0f}\n",
             workload, spec, n, tensors, bytes, fused.step_s, unfused.step_s, speedup, fused.messages,
             unfused.messages, fused.wire_bytes, unfused.wire_bytes, wrong, fused.control_rounds,
             unfused.control_rounds, fused.copy_bytes);
  for (const double alpha : {25e-6, 100e-6}) {
    fmt::print("{:>9} model +{:.0f} us/hop: fused +{:.4f} s, unfused +{:.4f} s, speedup {:.2f}\n", "", alpha * 1e6,
               latency_model(fused, n, alpha), latency_model(unfused, n, alpha),
               modeled_speedup(fused, unfused, n, alpha));
  }
}

int run_all(Communicator& comm, const Config& config) {
  const bool root = comm.rank() == 0;
  const auto control = comm.split(0, comm.rank());
  const double cost = message_cost(*control);
  if (root && !config.json) {
    fmt::print("# fusion_bench: {} ranks ({}), steps {} (+{} warm-up), fused threshold {} B, tensor limit {} B, "
               "cycle {} ms, {} pipeline lanes, zero-copy fusion {}; one 4-byte allreduce here: {:.1f} us (median "
               "of 50)\n",
               comm.size(), comm.backend(), config.steps, config.warmup, config.threshold, config.tensor_limit,
               config.cycle_ms, config.lanes, config.gather ? "on" : "off", cost * 1e6);
    fmt::print("{:>9} {:>18} {:>5} {:>7} {:>11} {:>10} {:>10} {:>8} {:>9} {:>9} {:>12} {:>12} {:>6} {:>7} {:>7} "
               "{:>10}\n",
               "workload", "spec", "ranks", "tensors", "bytes", "fused_s", "unfused_s", "speedup", "fused_msg",
               "unfus_msg", "fused_wire", "unfused_wire", "#wrong", "f_ctrl", "u_ctrl", "f_copied");
  } else if (root) {
    fmt::print("{{\"message_cost_us\": {:.2f}, \"ranks\": {}, \"lanes\": {}, \"gather\": {}}}\n", cost * 1e6,
               comm.size(), config.lanes, config.gather);
  }
  int bad = 0;
  for (const auto& workload : config.workloads) {
    const auto sizes = workload_sizes(workload);
    std::size_t bytes = 0;
    for (std::size_t s : sizes) bytes += s * sizeof(float);
    for (const auto& spec : config.specs) {
      const bool check = make_compressor(spec)->traits().summable && !make_compressor(spec)->traits().lossy;
      Run fused, unfused;
      if (config.mode != "unfused") fused = run_once(comm, *control, config, sizes, spec, config.threshold, check);
      if (config.mode != "fused") unfused = run_once(comm, *control, config, sizes, spec, 0, check);
      const long long wrong = check ? std::max(0LL, fused.wrong) + std::max(0LL, unfused.wrong) : -1;
      bad += wrong > 0;
      if (root) print_row(workload, spec, comm.size(), sizes.size(), bytes, fused, unfused, wrong, config);
      std::fflush(stdout);
    }
  }
  return bad;
}

// --local N: the ranks are threads over comm/local; returns the exit status.
int run_local(const Config& config, std::chrono::milliseconds timeout) {
  auto comms = make_local_communicators(config.local_ranks, timeout);
  std::vector<int> bad(comms.size(), 0);
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        bad[r] = run_all(*comms[r], config);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (std::size_t r = 0; r < comms.size(); ++r) {
    GRADCOMP_CHECK(errors[r].empty(), "rank {}: {}", r, errors[r]);
  }
  return std::any_of(bad.begin(), bad.end(), [](int b) { return b > 0; }) ? 1 : 0;
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
      } else if (arg == "--local") {
        config.local_ranks = std::stoi(value());
        GRADCOMP_CHECK(config.local_ranks >= 1, "--local needs at least one rank");
      } else if (arg == "--lanes") {
        config.lanes = std::stoi(value());
      } else if (arg == "--no-gather") {
        config.gather = false;
      } else if (arg == "--mode") {
        config.mode = value();
        GRADCOMP_CHECK(config.mode == "both" || config.mode == "fused" || config.mode == "unfused",
                       "--mode must be both, fused or unfused, got '{}'", config.mode);
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
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(config.timeout_s * 1000));
    if (config.local_ranks > 0) return run_local(config, timeout);
    MpiOptions mpi;
    mpi.timeout = timeout;
    auto comm = make_mpi_world_communicator(mpi);
    const int bad = run_all(*comm, config);
    return bad > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_bench: %s\n", e.what());
    return 2;
  }
}
