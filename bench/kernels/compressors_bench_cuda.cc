// CUDA compressor benchmark: every codec with a CUDA path, on 64M and 256M f32 values, timed with CUDA events, and
// reported as a fraction of a device-to-device copy measured in the same run.
//
//   compressors_bench_cuda [--sizes 64M,256M] [--reps N] [--specs fp16,bf16,...] [--csv FILE]
//
// For each spec: compress time (grad -> device payload, error feedback on the device), decompress time (payload ->
// dense f32), and the round trip's effective bandwidth = round_trip_bytes (src/core/traffic.h: the bytes a
// compress + EF + decompress must move) / (t_compress + t_decompress), divided by the copy bandwidth 2B / t_copy.
// The compress path includes one stream synchronization per call (the non-finite count), as in real use.
// Exits 2 when no CUDA device is present.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_device.h"
#include "src/core/traffic.h"

namespace {

using namespace gradcomp;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = text.find(',', start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

std::size_t parse_size(const std::string& text) {
  std::size_t multiplier = 1;
  std::string digits = text;
  if (!digits.empty() && (digits.back() == 'M' || digits.back() == 'm')) {
    multiplier = std::size_t{1} << 20;
    digits.pop_back();
  } else if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'k')) {
    multiplier = std::size_t{1} << 10;
    digits.pop_back();
  }
  return std::stoull(digits) * multiplier;
}

// Specs that are benchmarked when --specs is not given (those without a CUDA path are reported and skipped).
const char* const kDefaultSpecs[] = {"none",
                                     "fp16",
                                     "bf16",
                                     "qsgd:bits=4,bucket=512",
                                     "qsgd:bits=8,bucket=512",
                                     "terngrad",
                                     "onebit",
                                     "topk:ratio=0.01",
                                     "randomk:ratio=0.01",
                                     "blocktopk:ratio=0.01",
                                     "dgc"};

class Events {
 public:
  Events() {
    GRADCOMP_CUDA_CHECK(cudaEventCreate(&start_));
    GRADCOMP_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Events() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start(cudaStream_t stream) { GRADCOMP_CUDA_CHECK(cudaEventRecord(start_, stream)); }
  float stop_ms(cudaStream_t stream) {
    GRADCOMP_CUDA_CHECK(cudaEventRecord(stop_, stream));
    GRADCOMP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    GRADCOMP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

float median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sizes = {"64M", "256M"};
  std::vector<std::string> specs(std::begin(kDefaultSpecs), std::end(kDefaultSpecs));
  int reps = 5;
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--sizes") {
      sizes = split(next());
    } else if (arg == "--specs") {
      specs = split(next());
    } else if (arg == "--reps") {
      reps = std::max(1, std::atoi(next().c_str()));
    } else if (arg == "--csv") {
      csv_path = next();
    } else {
      std::fprintf(stderr, "usage: %s [--sizes 64M,256M] [--reps N] [--specs a,b] [--csv FILE]\n", argv[0]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("compressors_bench_cuda: %s\n", cuda_unavailable_reason().c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  GRADCOMP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  cudaStream_t stream{};
  GRADCOMP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Events events;
  std::vector<std::string> rows;
  rows.push_back("spec,numel,payload_bytes,compress_ms,decompress_ms,copy_ms,round_trip_GBps,copy_GBps,fraction_of_copy");
  std::printf("%-28s %10s %12s %10s %10s %9s %9s %8s\n", "spec", "numel", "payload_B", "comp_ms", "decomp_ms",
              "rt_GB/s", "copy_GB/s", "of_copy");

  for (const auto& size_text : sizes) {
    const std::size_t n = parse_size(size_text);
    float *grad = nullptr, *out = nullptr, *copy = nullptr;
    GRADCOMP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grad), n * sizeof(float)));
    GRADCOMP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)));
    GRADCOMP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&copy), n * sizeof(float)));
    {
      // Deterministic non-trivial values: a host pattern copied once.
      std::vector<float> host(std::min<std::size_t>(n, std::size_t{1} << 20));
      std::uint32_t x = 12345u;
      for (auto& v : host) {
        x = x * 1664525u + 1013904223u;
        v = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.01f;
      }
      for (std::size_t off = 0; off < n; off += host.size()) {
        const std::size_t count = std::min(host.size(), n - off);
        GRADCOMP_CUDA_CHECK(cudaMemcpy(grad + off, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
      }
    }
    // The reference: a device-to-device copy of the same bytes.
    std::vector<float> copy_times;
    for (int r = 0; r < reps + 1; ++r) {
      events.start(stream);
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(copy, grad, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      const float ms = events.stop_ms(stream);
      if (r > 0) copy_times.push_back(ms);
    }
    const float copy_ms = median(copy_times);
    const double copy_gbps = 2.0 * static_cast<double>(n * sizeof(float)) / (copy_ms * 1e6);
    std::printf("%-28s %10zu %12zu %10s %10.3f %9s %9.0f %8s\n", "(device-to-device copy)", n, n * sizeof(float), "-",
                copy_ms, "-", copy_gbps, "1.00");

    for (const auto& spec : specs) {
      std::unique_ptr<Compressor> compressor;
      try {
        compressor = make_compressor(spec);
      } catch (const Error& error) {
        std::printf("%-28s not registered: %s\n", spec.c_str(), error.what());
        continue;
      }
      const std::size_t capacity = compressor->max_payload_bytes(n);
      std::byte* payload = nullptr;
      GRADCOMP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&payload), capacity));
      std::vector<float> compress_times, decompress_times;
      std::size_t size = 0;
      bool ok = true;
      for (int r = 0; r < reps + 1 && ok; ++r) {
        CompressContext ctx;
        ctx.name = "bench";
        ctx.step = static_cast<std::uint64_t>(r);
        try {
          events.start(stream);
          size = compressor->compress(TensorView(grad, n, DType::kF32, Device::cuda(0), stream),
                                      std::span<std::byte>(payload, capacity), ctx);
          const float tc = events.stop_ms(stream);
          events.start(stream);
          compressor->decompress(PayloadBytes(std::span<const std::byte>(payload, size),
                                              Memory::on(Device::cuda(0), stream)),
                                 TensorView(out, n, DType::kF32, Device::cuda(0), stream), DecodeMode::kOverwrite);
          const float td = events.stop_ms(stream);
          if (r > 0) {
            compress_times.push_back(tc);
            decompress_times.push_back(td);
          }
        } catch (const Error& error) {
          std::printf("%-28s %10zu  skipped: %s\n", spec.c_str(), n, error.what());
          ok = false;
        }
      }
      cudaFree(payload);
      if (!ok) continue;
      const float tc = median(compress_times), td = median(decompress_times);
      const bool ef = compressor->traits().lossy && compressor->spec().find("ef=off") == std::string::npos;
      const double bytes = static_cast<double>(round_trip_bytes(n, size, ef));
      const double gbps = bytes / ((tc + td) * 1e6);
      std::printf("%-28s %10zu %12zu %10.3f %10.3f %9.0f %9.0f %8.2f\n", spec.c_str(), n, size, tc, td, gbps,
                  copy_gbps, gbps / copy_gbps);
      // The spec quoted: it may hold commas (qsgd:bits=4,bucket=512).
      rows.push_back(fmt::format("\"{}\",{},{},{:.4f},{:.4f},{:.4f},{:.1f},{:.1f},{:.3f}", spec, n, size, tc, td, copy_ms,
                                 gbps, copy_gbps, gbps / copy_gbps));
    }
    cudaFree(grad);
    cudaFree(out);
    cudaFree(copy);
  }
  cudaStreamDestroy(stream);
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    for (const auto& row : rows) csv << row << '\n';
  }
  return 0;
}
