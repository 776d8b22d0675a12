// allreduce_perf: nccl-tests-style sweep of compressed allreduce against the plain dense allreduce, under mpirun (or
// on in-process ranks with --backend local). For every size and spec: time per call (max over ranks, mean over
// iterations), algbw on the uncompressed bytes, bytes on the wire per rank, speedup over the dense allreduce measured
// in the same run, and the max error / #wrong of the first call against a reference rebuilt locally from what every
// rank's (fresh) compressor transmits. Exits 1 on any wrong element or ranks that disagree.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/collectives.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/philox_ops.cuh"

namespace gradcomp {
namespace {

struct Config {
  std::size_t min_bytes = 4 << 10, max_bytes = std::size_t{256} << 20;
  std::size_t factor = 4;
  std::vector<std::string> specs = {"fp16", "qsgd:bits=4", "topk:ratio=0.01", "dgc:ratio=0.001"};
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  int iters = 5;
  bool json = false;
  bool check = true;
  bool hierarchical = false;
  std::string backend = "mpi";
  int local_ranks = 4;
  double timeout_s = 600;
};

void usage() {
  std::puts(
      "usage: allreduce_perf [options]   (run under mpirun -np N, or with --backend local)\n"
      "  --bytes N            one size (suffix K, M, G = KiB, MiB, GiB); default: sweep 4K..256M\n"
      "  --min-bytes N, --max-bytes N, --factor F   the sweep (default 4K, 256M, x4)\n"
      "  --specs LIST         compressor specs after the dense baseline 'none', separated by ';' or ',' (a ','\n"
      "                       followed by key=value continues the previous spec): default\n"
      "                       fp16,qsgd:bits=4,topk:ratio=0.01,dgc:ratio=0.001\n"
      "  --algorithm A        auto|dense|allgather|sparse|sra (default auto: from the codec's traits)\n"
      "  --hierarchical       hierarchical mode (nodes from shared memory or GRADCOMP_LOCAL_SIZE)\n"
      "  --iters N            timed calls per row (default 5)\n"
      "  --no-check           skip the reference check (the #wrong column reads -1)\n"
      "  --timeout S          communicator timeout in seconds (default 600)\n"
      "  --backend B          mpi (default) or local (in-process ranks, --ranks N, default 4)\n"
      "  --json               one JSON object per row\n"
      "  -h, --help           this text\n"
      "Columns: spec, algorithm, ranks, bytes, time_s, algbw (GB/s of uncompressed bytes), wire_bytes (rank 0),\n"
      "speedup_vs_dense, max_error, wrong, compress_s/communicate_s/decompress_s (per call, max over ranks). Exit status 1 if any row has wrong elements or ranks disagree.");
}

std::size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) throw InvalidArgument(fmt::format("cannot parse byte count '{}'", text));
  GRADCOMP_CHECK(value >= 0, "byte count must be >= 0, got '{}'", text);
  return static_cast<std::size_t>(value * scale);
}

std::vector<std::string> split_specs(const std::string& list) {
  std::vector<std::string> specs;
  std::string token;
  auto flush = [&] {
    if (token.empty()) return;
    const bool continuation = token.find(':') == std::string::npos && token.find('=') != std::string::npos;
    if (continuation && !specs.empty()) {
      specs.back() += (specs.back().find(':') == std::string::npos ? ":" : ",") + token;
    } else {
      specs.push_back(token);
    }
    token.clear();
  };
  for (char c : list) {
    if (c == ',' || c == ';') {
      flush();
    } else {
      token += c;
    }
  }
  flush();
  return specs;
}

Config parse_args(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      GRADCOMP_CHECK(i + 1 < argc, "option {} needs a value (see --help)", arg);
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      usage();
      std::exit(0);
    } else if (arg == "--bytes") {
      config.min_bytes = config.max_bytes = parse_bytes(next());
    } else if (arg == "--min-bytes") {
      config.min_bytes = parse_bytes(next());
    } else if (arg == "--max-bytes") {
      config.max_bytes = parse_bytes(next());
    } else if (arg == "--factor") {
      config.factor = std::max<std::size_t>(2, std::stoul(next()));
    } else if (arg == "--specs") {
      config.specs = split_specs(next());
    } else if (arg == "--algorithm") {
      config.algorithm = parse_algorithm(next());
    } else if (arg == "--hierarchical") {
      config.hierarchical = true;
    } else if (arg == "--iters") {
      config.iters = std::max(1, std::stoi(next()));
    } else if (arg == "--no-check") {
      config.check = false;
    } else if (arg == "--timeout") {
      config.timeout_s = std::stod(next());
    } else if (arg == "--backend") {
      config.backend = next();
      GRADCOMP_CHECK(config.backend == "mpi" || config.backend == "local", "--backend must be mpi or local");
    } else if (arg == "--ranks") {
      config.local_ranks = std::stoi(next());
    } else if (arg == "--json") {
      config.json = true;
    } else {
      throw InvalidArgument(fmt::format("unknown option '{}' (see --help)", arg));
    }
  }
  for (const auto& spec : config.specs) (void)default_registry().validate(spec);
  return config;
}

// Gradient of `rank`: hashed uniforms shaped into a heavy-ish tailed distribution; deterministic, so every rank can
// rebuild every other rank's gradient for the reference.
void fill_gradient(std::vector<float>& values, int rank) {
  const std::uint64_t seed = 0x6772616463ull + (static_cast<std::uint64_t>(rank) << 40);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    const float v = static_cast<float>((z >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    values[i] = (u - 0.5f) * (0.01f + 4.0f * v * v * v * v);
  }
}

struct Row {
  std::string spec;
  std::string algorithm;
  int ranks = 1;
  std::size_t bytes = 0;
  double time_s = 0;
  std::size_t wire_bytes = 0;
  double speedup = 1;
  double max_error = 0;
  long long wrong = 0;
  bool identical = true;
  double compress_s = 0, communicate_s = 0, decompress_s = 0;  // per call, max over ranks
};

std::vector<std::byte> compress_as(Compressor& codec, std::span<const float> values, std::string_view name, int rank,
                                   int n, float prescale) {
  CompressContext ctx;
  ctx.name = name;
  ctx.rank = rank;
  ctx.world_size = n;
  ctx.prescale = prescale;
  std::vector<std::byte> out(codec.max_payload_bytes(values.size()));
  out.resize(codec.compress(TensorView(const_cast<float*>(values.data()), values.size(), DType::kF32), out, ctx));
  return out;
}

// What the first compressed allreduce (fresh state, step 0) must produce, rebuilt locally from every rank's gradient.
std::vector<float> reference(const std::string& spec, AllreduceAlgorithm algorithm, std::size_t numel, int n) {
  std::vector<float> ref(numel, 0.0f), grad(numel), decoded;
  if (spec == "none" && algorithm == AllreduceAlgorithm::kAuto) {
    for (int r = 0; r < n; ++r) {
      fill_gradient(grad, r);
      for (std::size_t i = 0; i < numel; ++i) ref[i] += grad[i];
    }
    for (float& v : ref) v /= static_cast<float>(n);
    return ref;
  }
  const bool sra = algorithm == AllreduceAlgorithm::kScatterReduceAllgather;
  const bool dense = algorithm == AllreduceAlgorithm::kDense;
  for (int r = 0; r < n; ++r) {
    fill_gradient(grad, r);
    auto twin = make_compressor(spec);
    const int chunks = sra ? n : 1;
    for (int c = 0; c < chunks; ++c) {
      const std::size_t b = numel * c / chunks, e = numel * (c + 1) / chunks;
      const std::string name = sra ? fmt::format("perf#chunk{}", c) : std::string("perf");
      const auto payload = compress_as(*twin, std::span(grad).subspan(b, e - b), name, r, n,
                                       dense ? 1.0f / static_cast<float>(n) : 1.0f);
      decoded.assign(e - b, 0.0f);
      twin->decompress(payload, TensorView(decoded.data(), e - b, DType::kF32), DecodeMode::kOverwrite);
      for (std::size_t i = b; i < e; ++i) ref[i] += decoded[i - b];
    }
  }
  if (!dense) {
    for (float& v : ref) v /= static_cast<float>(n);
  }
  if (sra) {
    for (int c = 0; c < n; ++c) {
      const std::size_t b = numel * c / n, e = numel * (c + 1) / n;
      auto owner = make_compressor(spec);
      const auto payload = compress_as(*owner, std::span(ref).subspan(b, e - b), fmt::format("perf#sra{}", c), c, n,
                                       1.0f);
      owner->decompress(payload, TensorView(ref.data() + b, e - b, DType::kF32), DecodeMode::kOverwrite);
    }
  }
  return ref;
}

AllreduceAlgorithm resolve(const Compressor& codec, AllreduceAlgorithm requested) {
  return resolve_algorithm(codec.traits(), requested);
}

float max_over_ranks(Communicator& comm, float value) {
  comm.allreduce(TensorView(&value, 1, DType::kF32), ReduceOp::kMax);
  return value;
}

Row run_row(Communicator& comm, const Config& config, const std::string& spec, std::size_t bytes, double dense_time,
            NodeGroups* groups) {
  const int n = comm.size();
  const std::size_t numel = bytes / sizeof(float);
  Row row;
  row.spec = spec;
  row.ranks = n;
  row.bytes = numel * sizeof(float);
  const bool plain = spec == "none" && !config.hierarchical;
  std::unique_ptr<Compressor> codec = make_compressor(spec);
  const AllreduceAlgorithm algorithm = plain ? AllreduceAlgorithm::kAuto : resolve(*codec, config.algorithm);
  row.algorithm = plain ? comm.backend() + "-allreduce" : std::string(algorithm_name(algorithm));

  std::vector<float> grad(numel), tensor(numel);
  fill_gradient(grad, comm.rank());
  AllreduceOptions options;
  options.algorithm = algorithm;
  options.hierarchical = config.hierarchical;
  options.nodes = groups;
  auto prepare = [&] { std::copy(grad.begin(), grad.end(), tensor.begin()); };  // outside the timed region
  auto call = [&](std::uint64_t step) -> AllreduceStats {
    const TensorView view(numel ? tensor.data() : nullptr, numel, DType::kF32);
    if (plain) {
      AllreduceStats stats;
      comm.allreduce(view, ReduceOp::kAverage);
      stats.wire_bytes = n > 1 ? 2 * row.bytes * (n - 1) / n : 0;
      return stats;
    }
    options.step = step;
    options.verify = step == 0;  // agreement is checked once per row; timed calls measure the data path
    return compressed_allreduce(comm, *codec, view, "perf", options);
  };

  // Checked call (also the warm-up).
  prepare();
  const AllreduceStats first = call(0);
  row.wire_bytes = first.wire_bytes;
  if (config.check) {
    row.max_error = 0;
    if (config.hierarchical && spec != "none") {
      row.wrong = -1;  // no closed-form reference for lossy hierarchical: only the ranks-identical check below
    } else {
      const auto ref = reference(spec, plain ? AllreduceAlgorithm::kAuto : algorithm, numel, n);
      double scale = 0;
      for (float v : ref) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      double rel = 1e-5 * n;
      const auto wire = codec->traits().wire_dtype;
      if (algorithm == AllreduceAlgorithm::kDense && wire != DType::kF32) rel = (wire == DType::kF16 ? 2e-3 : 1.6e-2) * n;
      if (config.hierarchical) rel = 1e-4 * n;
      const double tolerance = rel * scale + 1e-30;
      long long wrong = 0;
      for (std::size_t i = 0; i < numel; ++i) {
        const double error = std::fabs(static_cast<double>(tensor[i]) - ref[i]);
        row.max_error = std::max(row.max_error, error);
        wrong += !(error <= tolerance);
      }
      row.wrong = wrong;
      std::int32_t total = static_cast<std::int32_t>(std::min<long long>(wrong, 1 << 30));
      comm.allreduce(TensorView(&total, 1, DType::kI32), ReduceOp::kMax);
      row.wrong = std::max<long long>(row.wrong, total);
      row.max_error = max_over_ranks(comm, static_cast<float>(row.max_error));
    }
  } else {
    row.wrong = -1;
  }
  // All ranks identical: compare a hash of the result.
  const std::uint64_t hash = kernels::fnv1a64(reinterpret_cast<const char*>(tensor.data()), numel * sizeof(float));
  std::vector<std::uint64_t> hashes(n);
  comm.allgather(std::as_bytes(std::span(&hash, 1)), std::as_writable_bytes(std::span(hashes)));
  row.identical = std::all_of(hashes.begin(), hashes.end(), [&](std::uint64_t h) { return h == hashes[0]; });

  double total_time = 0;
  for (int it = 0; it < config.iters; ++it) {
    prepare();
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    const AllreduceStats stats = call(static_cast<std::uint64_t>(it + 1));
    const float seconds = std::chrono::duration<float>(std::chrono::steady_clock::now() - start).count();
    total_time += max_over_ranks(comm, seconds);
    row.compress_s += max_over_ranks(comm, static_cast<float>(stats.compress_s)) / config.iters;
    row.communicate_s += max_over_ranks(comm, static_cast<float>(stats.communicate_s)) / config.iters;
    row.decompress_s += max_over_ranks(comm, static_cast<float>(stats.decompress_s)) / config.iters;
  }
  row.time_s = total_time / config.iters;
  row.speedup = dense_time > 0 ? dense_time / row.time_s : 1.0;
  return row;
}

void print_row(const Config& config, const Row& row) {
  const double algbw = row.time_s > 0 ? row.bytes / row.time_s / 1e9 : 0;
  if (config.json) {
    fmt::print("{{\"spec\": \"{}\", \"algorithm\": \"{}\", \"ranks\": {}, \"bytes\": {}, \"time_s\": {:.6g}, "
               "\"algbw_gbps\": {:.6g}, \"wire_bytes\": {}, \"speedup_vs_dense\": {:.4g}, \"max_error\": {:.6g}, "
               "\"wrong\": {}, \"identical\": {}, \"compress_s\": {:.6g}, \"communicate_s\": {:.6g}, "
               "\"decompress_s\": {:.6g}}}\n",
               row.spec, row.algorithm, row.ranks, row.bytes, row.time_s, algbw, row.wire_bytes, row.speedup,
               row.max_error, row.wrong, row.identical ? "true" : "false", row.compress_s, row.communicate_s,
               row.decompress_s);
  } else {
    fmt::print("{:>28} {:>13} {:>5} {:>12} {:>11.6f} {:>9.3f} {:>12} {:>8.3f} {:>10.3g} {:>6} {:>8.3f} {:>8.3f} "
               "{:>8.3f}{}\n",
               row.spec, row.algorithm, row.ranks, row.bytes, row.time_s, algbw, row.wire_bytes, row.speedup,
               row.max_error, row.wrong, row.compress_s, row.communicate_s, row.decompress_s,
               row.identical ? "" : "  RANKS DIFFER");
  }
  std::fflush(stdout);
}

// Runs the whole sweep on one rank; returns the number of bad rows.
int run(Communicator& comm, const Config& config) {
  const bool root = comm.rank() == 0;
  NodeGroups groups;
  if (config.hierarchical) groups = make_node_groups(comm);
  if (root && !config.json) {
    fmt::print("# allreduce_perf: {} ranks ({}), iters {}, algorithm {}{}\n", comm.size(), comm.backend(),
               config.iters, algorithm_name(config.algorithm), config.hierarchical ? ", hierarchical" : "");
    fmt::print("{:>28} {:>13} {:>5} {:>12} {:>11} {:>9} {:>12} {:>8} {:>10} {:>6} {:>8} {:>8} {:>8}\n", "spec",
               "algorithm", "ranks", "bytes", "time_s", "algbw", "wire_bytes", "speedup", "max_err", "#wrong", "compr_s",
               "comm_s", "decomp_s");
  }
  int bad = 0;
  for (std::size_t bytes = config.min_bytes; bytes <= config.max_bytes; bytes *= config.factor) {
    const Row dense = run_row(comm, config, "none", bytes, 0, config.hierarchical ? &groups : nullptr);
    bad += dense.wrong > 0 || !dense.identical;
    if (root) print_row(config, dense);
    for (const auto& spec : config.specs) {
      if (spec == "none") continue;
      const Row row = run_row(comm, config, spec, bytes, dense.time_s, config.hierarchical ? &groups : nullptr);
      bad += row.wrong > 0 || !row.identical;
      if (root) print_row(config, row);
    }
    if (bytes == 0) break;
  }
  return bad;
}

}  // namespace
}  // namespace gradcomp

int main(int argc, char** argv) {
  using namespace gradcomp;
  try {
    const Config config = parse_args(argc, argv);
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(config.timeout_s * 1000));
    int bad = 0;
    if (config.backend == "local") {
      auto comms = make_local_communicators(config.local_ranks, timeout);
      std::vector<int> bads(config.local_ranks, 0);
      std::vector<std::thread> threads;
      std::exception_ptr failure;
      for (int r = 0; r < config.local_ranks; ++r) {
        threads.emplace_back([&, r] {
          try {
            bads[r] = run(*comms[r], config);
          } catch (...) {
            if (r == 0) failure = std::current_exception();
          }
        });
      }
      for (auto& t : threads) t.join();
      if (failure) std::rethrow_exception(failure);
      bad = bads[0];
    } else {
      MpiOptions options;
      options.timeout = timeout;
      auto world = make_mpi_world_communicator(options);
      bad = run(*world, config);
    }
    if (bad > 0) {
      std::fprintf(stderr, "allreduce_perf: %d row(s) with wrong results or ranks that disagree\n", bad);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf: %s\n", e.what());
    return 2;
  }
}
