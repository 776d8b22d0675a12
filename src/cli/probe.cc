// gradcomp probe: compress and decompress a synthetic gradient; report ratio, error, bias and speed vs memcpy.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/cpu_parallel.h"
#include "kernels/philox_ops.cuh"
#include "src/cli/args.h"
#include "src/cli/commands.h"
#include "src/core/traffic.h"

namespace gradcomp::cli {
namespace {

constexpr const char* kProbeHelp = R"(usage: gradcomp probe SPEC [--numel N | --shape RxC[x...]]
                            [--dist normal|uniform|lognormal|sparse] [--seed S] [--threads T] [--json]

Compresses and decompresses one synthetic f32 gradient with the compressor SPEC (e.g. "topk:ratio=0.01") and reports:
  ratio            uncompressed bytes / payload bytes
  rel_error        ||decoded - grad||_2 / ||grad||_2 of the first step (empty error-feedback state)
  bias             mean of (decoded - grad)
  payload_bytes    size of the payload
  compress_gbps    gradient GB/s through compress (+ error feedback)
  decompress_gbps  gradient GB/s through decompress
  memcpy_gbps      GB/s of memcpy of the same buffer, same threads, same run
  memcpy_fraction  (bytes the round trip must move / its time) / (2 x memcpy bytes / memcpy time)

options:
  --numel N      elements (default 1000000; 1e6 notation accepted), a vector
  --shape S      a tensor of this shape instead (e.g. 4096x1024): shape-aware codecs (powersgd) see a matrix of
                 its first dimension's rows
  --dist D       value distribution (default normal)
  --seed S       seed of the synthetic values (default 1)
  --threads T    worker threads for compressor and memcpy (default 1; 0 = all)
  --json         print one JSON object instead of text
)";

std::vector<float> synthetic_gradient(std::size_t numel, const std::string& dist, std::uint64_t seed) {
  GRADCOMP_CHECK(dist == "normal" || dist == "uniform" || dist == "lognormal" || dist == "sparse",
                 "unknown --dist '{}' (valid: normal, uniform, lognormal, sparse)", dist);
  std::vector<float> values(numel);
  const auto stream = kernels::PhiloxStream::make(seed, 0x70726f6265ull, 0);
  for (std::size_t i = 0; i < numel; ++i) {
    const auto block = stream.block(i);
    const float u1 = std::max(kernels::uniform01(block.v[0]), 1e-7f);
    const float u2 = kernels::uniform01(block.v[1]);
    const float normal = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    if (dist == "normal") {
      values[i] = 0.01f * normal;
    } else if (dist == "uniform") {
      values[i] = 2.0f * kernels::uniform01(block.v[2]) - 1.0f;
    } else if (dist == "lognormal") {
      values[i] = (block.v[3] & 1 ? 1.0f : -1.0f) * 0.001f * std::exp(2.0f * normal);
    } else {
      values[i] = kernels::uniform01(block.v[2]) < 0.1f ? 0.01f * normal : 0.0f;
    }
  }
  return values;
}

// "4096x1024" -> {4096, 1024}; throws InvalidArgument for anything else.
std::vector<std::size_t> parse_shape(const std::string& text) {
  std::vector<std::size_t> dims;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('x', start), text.size());
    const std::string part = text.substr(start, end - start);
    GRADCOMP_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos && part.size() < 10,
                   "--shape '{}': expected dimensions like 4096x1024", text);
    dims.push_back(static_cast<std::size_t>(std::stoull(part)));
    start = end + 1;
  }
  return dims;
}

// Runs fn repeatedly (at least 3 times and 0.3 s, at most 100 times); returns the mean seconds per call.
template <typename Fn>
double time_per_call(Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  int calls = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (calls < 3 || (elapsed < 0.3 && calls < 100)) {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return elapsed / calls;
}

struct ProbeOptions {
  std::string spec;
  std::size_t numel = 0;
  std::size_t rows = 0;  // 0: a vector (--numel); else the first dimension of --shape
  std::string shape_text, dist;
  std::uint64_t seed = 1;
  int threads = 1;
  bool json = false;
};

ProbeOptions parse_probe_options(Args& args) {
  ProbeOptions o;
  o.json = args.flag("--json");
  o.numel = static_cast<std::size_t>(args.option_int("--numel", 1000000));
  o.shape_text = args.option("--shape", "");
  if (!o.shape_text.empty()) {
    const auto dims = parse_shape(o.shape_text);
    o.numel = 1;
    for (std::size_t d : dims) o.numel *= d;
    o.rows = dims.size() >= 2 ? dims[0] : 0;
  }
  o.dist = args.option("--dist", "normal");
  o.seed = static_cast<std::uint64_t>(args.option_int("--seed", 1));
  o.threads = static_cast<int>(args.option_int("--threads", 1));
  const auto positionals = args.positionals("probe");
  GRADCOMP_CHECK(positionals.size() == 1, "probe needs exactly one SPEC (e.g. gradcomp probe topk:ratio=0.01), got {}",
                 positionals.size());
  o.spec = positionals[0];
  return o;
}

// What probe reports: the first step's accuracy and the timed round trip's speeds.
struct ProbeReport {
  std::size_t payload_bytes = 0;
  double rel_error = 0, bias = 0;
  CompressStats stats;
  double compress_s = 0, decompress_s = 0, memcpy_s = 0;
  std::size_t timed_payload = 0;
};

// The first step, with empty error-feedback state: compress, decompress, and the error of the decoded values.
void measure_first_step(Compressor& compressor, const TensorView& grad_view, std::span<const float> grad,
                        std::vector<std::byte>& payload, std::vector<float>& decoded, ProbeReport& report) {
  const auto decoded_view = TensorView::of(std::span<float>(decoded));
  report.payload_bytes = compressor.compress(grad_view, payload, CompressContext{.name = "probe", .step = 0});
  const auto payload_span = std::span<const std::byte>(payload).first(report.payload_bytes);
  compressor.decompress(payload_span, decoded_view, DecodeMode::kOverwrite);
  double err2 = 0, ref2 = 0, signed_error = 0;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const double diff = static_cast<double>(decoded[i]) - grad[i];
    err2 += diff * diff;
    ref2 += static_cast<double>(grad[i]) * grad[i];
    signed_error += diff;
  }
  report.rel_error = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  report.bias = grad.empty() ? 0.0 : signed_error / static_cast<double>(grad.size());
  report.stats = compressor.last_stats();
}

// Later steps (error feedback active), decompress, and memcpy of the same buffer with the same threads.
void time_round_trip(Compressor& compressor, const TensorView& grad_view, std::span<const float> grad, int threads,
                     std::vector<std::byte>& payload, std::vector<float>& decoded, ProbeReport& report) {
  const auto decoded_view = TensorView::of(std::span<float>(decoded));
  std::uint64_t step = 1;
  report.compress_s = time_per_call([&] {
    compressor.compress(grad_view, payload, CompressContext{.name = "probe", .step = step++});
  });
  report.timed_payload = compressor.last_stats().payload_bytes;
  const auto timed_span = std::span<const std::byte>(payload).first(report.timed_payload);
  report.decompress_s =
      time_per_call([&] { compressor.decompress(timed_span, decoded_view, DecodeMode::kOverwrite); });
  std::vector<float> copy(grad.size());
  report.memcpy_s = time_per_call([&] {
    kernels::parallel_chunks(grad.size(), kernels::kParallelChunk, threads,
                             [&](std::size_t, std::size_t b, std::size_t e) {
                               std::memcpy(copy.data() + b, grad.data() + b, (e - b) * sizeof(float));
                             });
  });
}

void print_report(const ProbeOptions& o, const std::string& spec, const ProbeReport& r) {
  const double bytes = static_cast<double>(o.numel) * sizeof(float);
  const double ratio = r.payload_bytes ? bytes / static_cast<double>(r.payload_bytes) : 0.0;
  const double compress_gbps = bytes / r.compress_s / 1e9;
  const double decompress_gbps = bytes / r.decompress_s / 1e9;
  const double memcpy_gbps = bytes / r.memcpy_s / 1e9;
  const bool ef = spec.find("ef=on") != std::string::npos;
  const double moved = static_cast<double>(round_trip_bytes(o.numel, r.timed_payload, ef));
  const double memcpy_fraction = (moved / (r.compress_s + r.decompress_s)) / (2.0 * bytes / r.memcpy_s);
  if (o.json) {
    fmt::print(
        "{{\"spec\": {}, \"numel\": {}, \"dist\": {}, \"threads\": {}, \"ratio\": {:.6g}, \"rel_error\": {:.6g}, "
        "\"bias\": {:.6g}, \"payload_bytes\": {}, \"selected\": {}, \"saturated\": {}, \"compress_gbps\": {:.6g}, "
        "\"decompress_gbps\": {:.6g}, \"memcpy_gbps\": {:.6g}, \"round_trip_bytes\": {}, \"memcpy_fraction\": "
        "{:.6g}}}\n",
        json_string(spec), o.numel, json_string(o.dist), o.threads, ratio, r.rel_error, r.bias, r.payload_bytes,
        r.stats.selected, r.stats.saturated, compress_gbps, decompress_gbps, memcpy_gbps,
        static_cast<std::size_t>(moved), memcpy_fraction);
    return;
  }
  fmt::print("spec             {}\n", spec);
  fmt::print("gradient         {} x f32 ({:.1f} MB{}), {} distribution, seed {}, {} thread(s)\n", o.numel, bytes / 1e6,
             o.shape_text.empty() ? "" : ", shape " + o.shape_text, o.dist, o.seed, o.threads);
  fmt::print("ratio            {:.2f}x  ({} payload bytes, {} values selected, {} saturated)\n", ratio, r.payload_bytes,
             r.stats.selected, r.stats.saturated);
  fmt::print("rel_error        {:.4g}\n", r.rel_error);
  fmt::print("bias             {:.4g}\n", r.bias);
  fmt::print("compress         {:.3f} GB/s of gradient\n", compress_gbps);
  fmt::print("decompress       {:.3f} GB/s of gradient\n", decompress_gbps);
  fmt::print("memcpy           {:.3f} GB/s (same buffer, same run)\n", memcpy_gbps);
  fmt::print("memcpy_fraction  {:.3f}  (round trip moves {} bytes)\n", memcpy_fraction,
             static_cast<std::size_t>(moved));
}

}  // namespace

int run_probe(std::vector<std::string> raw) {
  Args args(std::move(raw));
  if (args.flag("--help") || args.flag("-h")) {
    fmt::print("{}", kProbeHelp);
    return 0;
  }
  const ProbeOptions options = parse_probe_options(args);
  auto compressor = make_compressor(options.spec);
  compressor->set_threads(options.threads);
  const std::vector<float> grad = synthetic_gradient(options.numel, options.dist, options.seed);
  const auto grad_view = TensorView::of(std::span<const float>(grad)).with_rows(options.rows);
  std::vector<std::byte> payload(compressor->max_payload_bytes(options.numel));
  std::vector<float> decoded(options.numel);
  ProbeReport report;
  measure_first_step(*compressor, grad_view, grad, payload, decoded, report);
  time_round_trip(*compressor, grad_view, grad, options.threads, payload, decoded, report);
  print_report(options, compressor->spec(), report);
  return 0;
}

}  // namespace gradcomp::cli
