#include "bench/comm/perf/perf_harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench/comm/perf/perf_reference.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/philox_ops.cuh"
#include "tests/comm/flat_reference.h"
#include "tests/comm/sum_bound.h"

namespace gradcomp::perf {
namespace {

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
  bool identity_checked = true;
  double compress_s = 0, communicate_s = 0, decompress_s = 0;  // per call, max over ranks
  bool bad() const { return wrong > 0 || !identical; }
};

float max_over_ranks(Communicator& comm, float value) {
  comm.allreduce(TensorView(&value, 1, DType::kF32), ReduceOp::kMax);
  return value;
}

// The algorithm a row of `spec` runs: the plain dense allreduce for the baseline "none" (outside hierarchical and
// auto modes),
// else the requested one or, for kAuto, the codec's own.
struct RowPlan {
  bool plain = false;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
};
RowPlan plan_row(const Config& config, const std::string& spec) {
  if (spec == "none" && !config.hierarchical && !config.hierarchy_auto) return {true, AllreduceAlgorithm::kAuto};
  return {false, resolve_algorithm(make_compressor(spec)->traits(), config.algorithm)};
}

// Checks the first call's result against the reference on every rank (fills max_error and wrong). `groups`: the
// node groups when the first call ran hierarchical, else null.
void check_row(Communicator& comm, const Config& config, const RowPlan& plan, const std::vector<float>& tensor,
               NodeGroups* groups, Row& row) {
  row.wrong = -1;
  if (!config.check) return;
  const auto nodes = groups != nullptr ? testing::node_members(comm, *groups) : std::vector<std::vector<int>>{};
  const std::size_t rows = config.rows && tensor.size() % config.rows == 0 ? config.rows : 0;
  const bool grid = config.hierarchical || config.hierarchy_auto;  // as run_row fills the gradient
  const auto ref = reference(row.spec, plan.algorithm, plan.plain, tensor.size(), rows, comm.size(), nodes, grid);
  if (!ref) return;
  double max_error = 0;
  const long long wrong = static_cast<long long>(testing::count_outside(tensor, ref->values, ref->bounds, &max_error));
  row.max_error = max_error;
  std::int32_t total = static_cast<std::int32_t>(std::min<long long>(wrong, 1 << 30));
  comm.allreduce(TensorView(&total, 1, DType::kI32), ReduceOp::kMax);
  row.wrong = std::max<long long>(wrong, total);
  row.max_error = max_over_ranks(comm, static_cast<float>(row.max_error));
}

// A row's gradient and the tensor its calls reduce, kept for the next row of the same size: allocating them afresh
// for every row cost a simulated run (bench/sim, where every large allocation maps folded memory) more system time
// than the rest of the harness.
struct RowBuffers {
  std::vector<float> grad, tensor;
};

Row run_row(Communicator& comm, const Config& config, const std::string& spec, std::size_t bytes, double dense_time,
            NodeGroups* groups, RowBuffers& buffers) {
  const int n = comm.size();
  const std::size_t numel = bytes / sizeof(float);
  Row row;
  row.spec = spec;
  row.ranks = n;
  row.bytes = numel * sizeof(float);
  const RowPlan plan = plan_row(config, spec);
  std::unique_ptr<Compressor> codec = make_compressor(spec);
  row.algorithm = plan.plain ? comm.backend() + "-allreduce" : std::string(algorithm_name(plan.algorithm));

  if (buffers.grad.size() != numel) {
    buffers = {};
    buffers.grad.resize(numel);
    buffers.tensor.resize(numel);
  }
  std::vector<float>& grad = buffers.grad;
  std::vector<float>& tensor = buffers.tensor;
  fill_gradient(grad, comm.rank(), /*grid=*/config.hierarchical || config.hierarchy_auto);
  AllreduceOptions options;
  options.algorithm = plan.algorithm;
  options.hierarchical = config.hierarchical;
  options.hierarchy_auto = config.hierarchy_auto && !plan.plain;
  options.nodes = groups;
  auto prepare = [&] { std::copy(grad.begin(), grad.end(), tensor.begin()); };  // outside the timed region
  auto call = [&](std::uint64_t step) -> AllreduceStats {
    const TensorView vector(numel ? tensor.data() : nullptr, numel, DType::kF32);
    const TensorView view = config.rows && numel % config.rows == 0 ? vector.with_rows(config.rows) : vector;
    if (plan.plain) {
      AllreduceStats stats;
      comm.allreduce(view, ReduceOp::kAverage);
      stats.wire_bytes = n > 1 ? 2 * row.bytes * (n - 1) / n : 0;
      return stats;
    }
    options.step = step;
    options.verify = step == 0;  // agreement is checked once per row; timed calls measure the data path
    return compressed_allreduce(comm, *codec, view, "perf", options);
  };

  prepare();  // the checked call is also the warm-up
  const AllreduceStats first = call(0);
  row.wire_bytes = first.wire_bytes;
  if (options.hierarchy_auto) row.algorithm += first.hierarchical ? "+hier" : "+flat";
  check_row(comm, config, plan, tensor, first.hierarchical ? groups : nullptr, row);
  // All ranks identical: compare a hash of the result (not with --no-check: hashing 100 MB a rank was most of a
  // simulated run's CPU time, docs/scaling.md).
  row.identity_checked = config.check;
  if (config.check) {
    const std::uint64_t hash = kernels::fnv1a64(reinterpret_cast<const char*>(tensor.data()), numel * sizeof(float));
    std::vector<std::uint64_t> hashes(n);
    comm.allgather(std::as_bytes(std::span(&hash, 1)), std::as_writable_bytes(std::span(hashes)));
    row.identical = std::all_of(hashes.begin(), hashes.end(), [&](std::uint64_t h) { return h == hashes[0]; });
  }

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

void print_header(const Suite& suite, const Config& config, Communicator& comm, std::string_view algorithm) {
  if (config.json) return;
  fmt::print("# {}: {} ranks ({}), iters {}, algorithm {}{}\n", suite.name, comm.size(), comm.backend(), config.iters,
             algorithm, config.hierarchical ? ", hierarchical" : config.hierarchy_auto ? ", hierarchy auto" : "");
  fmt::print("{:>28} {:>13} {:>5} {:>12} {:>11} {:>9} {:>12} {:>8} {:>10} {:>6} {:>8} {:>8} {:>8}\n", "spec",
             "algorithm", "ranks", "bytes", "time_s", "algbw", "wire_bytes", "speedup", "max_err", "#wrong", "compr_s",
             "comm_s", "decomp_s");
}

void print_row(const Config& config, const Row& row) {
  const double algbw = row.time_s > 0 ? row.bytes / row.time_s / 1e9 : 0;
  if (config.json) {
    fmt::print("{{\"spec\": \"{}\", \"algorithm\": \"{}\", \"ranks\": {}, \"bytes\": {}, \"time_s\": {:.6g}, "
               "\"algbw_gbps\": {:.6g}, \"wire_bytes\": {}, \"speedup_vs_dense\": {:.4g}, \"max_error\": {:.6g}, "
               "\"wrong\": {}, \"identical\": {}, \"compress_s\": {:.6g}, \"communicate_s\": {:.6g}, "
               "\"decompress_s\": {:.6g}}}\n",
               row.spec, row.algorithm, row.ranks, row.bytes, row.time_s, algbw, row.wire_bytes, row.speedup,
               row.max_error, row.wrong, !row.identity_checked ? "null" : row.identical ? "true" : "false",
               row.compress_s, row.communicate_s,
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

// The specs of the sweep grouped by the algorithm they run, in order of first appearance (the baseline, "none" unless
// --baseline, is the first row of every table, not a row of its own table).
std::vector<std::pair<std::string, std::vector<std::string>>> tables(const Config& config) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& spec : config.specs) {
    const RowPlan plan = plan_row(config, spec);
    if (plan.plain || spec == config.baseline) continue;
    const std::string name(algorithm_name(plan.algorithm));
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& table) { return table.first == name; });
    if (it == out.end()) it = out.insert(out.end(), {name, {}});
    it->second.push_back(spec);
  }
  if (out.empty()) out.push_back({std::string(algorithm_name(config.algorithm)), {}});
  return out;
}

// Runs the whole sweep on one rank; returns the number of bad rows.
int run(const Suite& suite, Communicator& comm, const Config& config) {
  const bool root = comm.rank() == 0;
  NodeGroups groups;
  if (config.hierarchical || config.hierarchy_auto) groups = make_node_groups(comm);
  NodeGroups* nodes = config.hierarchical || config.hierarchy_auto ? &groups : nullptr;
  if (config.hierarchy_auto) {
    learn_links(comm, groups);
    const LinkModel& l = groups.links;
    auto cost = [](const LinkCost& c) {
      return fmt::format("[{:.4g}, {:.4g}, {:.4g}, {:.4g}]", c.latency_s, c.bytes_per_s / 1e9, c.knee_bytes, c.knee_s);
    };
    auto level = [&](const LevelCosts& c) {
      return fmt::format("{{\"allreduce\": {}, \"allgatherv\": {}, \"alltoallv\": {}, \"broadcast\": {}}}",
                         cost(c.allreduce), cost(c.allgatherv), cost(c.alltoallv), cost(c.broadcast));
    };
    if (root) {
      fmt::print("{}{{\"learned_links\": {{\"nodes\": {}, \"per_node\": {}, "
                 "\"units\": \"[latency s, GB/s past the knee, knee bytes, knee s]\", "
                 "\"node\": {}, \"leaders\": {}, \"world\": {}}}}}\n",
                 config.json ? "" : "# ", groups.node_count, groups.per_node, level(l.node), level(l.leaders),
                 level(l.world));
    }
  }
  int bad = 0;
  std::map<std::size_t, Row> dense;  // the baseline of each size, measured once and printed in every table
  RowBuffers buffers;
  bool first_table = true;
  for (const auto& [algorithm, specs] : tables(config)) {
    if (root && !first_table && !config.json) fmt::print("\n");
    first_table = false;
    if (root) print_header(suite, config, comm, algorithm);
    for (std::size_t bytes = config.min_bytes; bytes <= config.max_bytes; bytes *= config.factor) {
      auto found = dense.find(bytes);
      if (found == dense.end()) {
        found = dense.emplace(bytes, run_row(comm, config, config.baseline, bytes, 0, nodes, buffers)).first;
        bad += found->second.bad();
      }
      if (root) print_row(config, found->second);
      for (const auto& spec : specs) {
        const Row row = run_row(comm, config, spec, bytes, found->second.time_s, nodes, buffers);
        bad += row.bad();
        if (root) print_row(config, row);
      }
      if (bytes == 0) break;
    }
  }
  return bad;
}

}  // namespace

int perf_main(const Suite& suite, int argc, char** argv) {
  try {
    const Config config = parse_args(suite, argc, argv);
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
            bads[r] = run(suite, *comms[r], config);
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
      bad = run(suite, *world, config);
    }
    if (bad > 0) {
      std::fprintf(stderr, "%s: %d row(s) with wrong results or ranks that disagree\n", suite.name.c_str(), bad);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", suite.name.c_str(), e.what());
    return 2;
  }
}

}  // namespace gradcomp::perf
