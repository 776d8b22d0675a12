#include "bench/comm/perf/perf_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp::perf {
namespace {

std::string join(const std::vector<std::string>& specs) {
  std::string out;
  for (const auto& spec : specs) out += (out.empty() ? "" : ";") + spec;
  return out;
}

void usage(const Suite& suite) {
  const bool fixed = suite.algorithm != AllreduceAlgorithm::kAuto;
  fmt::print(
      "usage: {} [options]   (run under mpirun -np N, or with --backend local)\n"
      "{}\n"
      "  --bytes N            one size (suffix K, M, G = KiB, MiB, GiB); default: sweep 4K..256M\n"
      "  --min-bytes N, --max-bytes N, --factor F   the sweep (default 4K, 256M, x4)\n"
      "  --specs LIST         compressor specs after the dense baseline 'none', separated by ';' or ',' (a ','\n"
      "                       followed by key=value continues the previous spec); default: {}\n"
      "{}"
      "  --hierarchical       hierarchical mode (nodes from shared memory or GRADCOMP_LOCAL_SIZE)\n"
      "  --hierarchy-auto     learn the intra/inter-node links first, then each row takes flat or hierarchical,\n"
      "                       whichever the cost model predicts faster (its algorithm column says which)\n"
      "  --rows R             view the tensor as R x numel/R (a divisor of every size; default {}: {})\n"
      "  --iters N            timed calls per row (default 5)\n"
      "  --no-check           skip the reference and ranks-identical checks (#wrong reads -1, identical null)\n"
      "  --baseline SPEC      each table's reference row (default none: MPI's plain allreduce outside\n"
      "                       hierarchical and auto modes)\n"
      "  --timeout S          communicator timeout in seconds (default 600)\n"
      "  --backend B          mpi (default) or local (in-process ranks, --ranks N, default 4)\n"
      "  --json               one JSON object per row\n"
      "  -h, --help           this text\n"
      "Columns: spec, algorithm, ranks, bytes, time_s, algbw (GB/s of uncompressed bytes), wire_bytes (rank 0),\n"
      "speedup_vs_dense (the plain dense allreduce of the same size, same run), max_error, wrong (elements off the\n"
      "reference rebuilt from what every rank's fresh compressor sends; -1: not checked), compress_s/communicate_s/\n"
      "decompress_s (per call, max over ranks). Exit status 1 if any row has wrong elements or ranks disagree.\n",
      suite.name, suite.about, join(suite.default_specs),
      fixed ? ""
            : "  --algorithm A        auto|dense|allgather|sparse|sra|rounds (default auto: from the codec's\n"
              "                       traits, one table per algorithm)\n",
      suite.rows, suite.rows ? "a matrix" : "a vector");
}

std::size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() || end == text.c_str())
    throw InvalidArgument(fmt::format("cannot parse byte count '{}'", text));
  GRADCOMP_CHECK(value >= 0, "byte count must be >= 0, got '{}'", text);
  return static_cast<std::size_t>(value * scale);
}

}  // namespace

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

Config parse_args(const Suite& suite, int argc, char** argv) {
  Config config;
  config.specs = suite.default_specs;
  config.algorithm = suite.algorithm;
  config.rows = suite.rows;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      GRADCOMP_CHECK(i + 1 < argc, "option {} needs a value (see --help)", arg);
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      usage(suite);
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
    } else if (arg == "--algorithm" && suite.algorithm == AllreduceAlgorithm::kAuto) {
      config.algorithm = parse_algorithm(next());
    } else if (arg == "--hierarchical") {
      config.hierarchical = true;
    } else if (arg == "--hierarchy-auto") {
      config.hierarchy_auto = true;
    } else if (arg == "--rows") {
      config.rows = std::stoul(next());
    } else if (arg == "--iters") {
      config.iters = std::max(1, std::stoi(next()));
    } else if (arg == "--no-check") {
      config.check = false;
    } else if (arg == "--baseline") {
      config.baseline = next();
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
  (void)default_registry().validate(config.baseline);
  return config;
}

}  // namespace gradcomp::perf
