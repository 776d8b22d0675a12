// The device-resident path on one GPU, with ranks as threads: compressed_allreduce and the fused Runtime on CUDA
// tensors over a communicator that takes device memory (the in-process backend behind testing::through_host)
// give the same bits as the host path on the same inputs, never stage the tensor, allocate nothing after the first
// step (the host waits are recorded), and a CUDA tensor on a communicator without device memory is staged once per call and counted. top-k with f16
// values and odd k makes payloads of odd length: the next rank's payload in the gathered buffer must still be
// 16-byte aligned (misaligned int32 index loads kill the context). Without a CUDA device: SKIPPED (77).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tests/comm/through_host.h"
#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"
#include "tests/gpu/device_path_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;
using testing::run_ranks;
using testing::values_of;

// Ranks (threads) of the comparisons: 3, or GRADCOMP_DEVICE_PATH_RANKS=N (1..8; compute-sanitizer's racecheck, whose
// runs of several host threads on one GPU stall: bench/gpu/check.sh).
int ranks() {
  static const int n = [] {
    const char* value = std::getenv("GRADCOMP_DEVICE_PATH_RANKS");
    const int parsed = value ? std::atoi(value) : 3;
    return std::clamp(parsed, 1, 8);
  }();
  return n;
}

class DevicePath : public ::testing::TestWithParam<const char*> {};

// 300007: every grid-stride loop runs more than once. GRADCOMP_PARITY_MAX_NUMEL=N (compute-sanitizer runs, where
// every kernel is many times slower: bench/gpu/check.sh) lowers it to N.
std::size_t device_path_numel() {
  std::size_t n = 300007;
  if (const char* limit = std::getenv("GRADCOMP_PARITY_MAX_NUMEL")) {
    n = std::min<std::size_t>(n, std::strtoull(limit, nullptr, 10));
  }
  return n;
}

// Two steps of compressed_allreduce (error feedback carried) on the device and on the host: same bits, every rank.
TEST_P(DevicePath, CompressedAllreduceMatchesTheHostBitForBit) {
  const std::string spec = GetParam();
  const std::size_t n = device_path_numel();
  std::vector<std::vector<float>> host_results(ranks()), device_results(ranks());
  std::mutex mutex;
  std::size_t waits = 0;  // rank 0's host waits in its second call
  run_ranks(ranks(), [&](Communicator& comm) {
    auto host_codec = make_compressor(spec);
    auto device_codec = make_compressor(spec);
    auto device_comm = testing::through_host(comm);
    for (int step = 0; step < 2; ++step) {
      AllreduceOptions options;
      options.step = static_cast<std::uint64_t>(step);
      std::vector<float> host = values_of(comm.rank(), 0, n, step);
      DeviceArray<float> device(host);
      compressed_allreduce(comm, *host_codec, TensorView::of(std::span<float>(host)), "w", options);
      const AllreduceStats stats = compressed_allreduce(
          *device_comm, *device_codec, TensorView(device.data(), n, DType::kF32, Device::cuda(0)), "w", options);
      EXPECT_EQ(stats.staged_bytes, 0u) << spec << ": the device path staged the tensor";
      if (step == 1) {
        EXPECT_EQ(stats.allocations, 0u) << spec << ": the second step obtained memory";
        // Host waits: the codec's (non-finite count, data-dependent sizes), the algorithm's, at most two per decoded
        // payload; recorded for docs/cuda.md's table (the XML report's property).
        if (comm.rank() == 0) waits = stats.synchronizations;
        std::lock_guard lock(mutex);
        host_results[comm.rank()] = host;
        device_results[comm.rank()] = device.download();
      }
    }
  });
  RecordProperty("synchronizations", static_cast<int>(waits));
  for (int r = 0; r < ranks(); ++r) {
    ASSERT_EQ(device_results[r].size(), host_results[r].size());
    EXPECT_EQ(std::memcmp(device_results[r].data(), host_results[r].data(), n * sizeof(float)), 0)
        << spec << ": rank " << r << " differs from the host path";
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, DevicePath,
                         ::testing::Values("none", "fp16", "qsgd:bits=4", "topk:ratio=0.01", "topk:k=5,values=f16",
                                           "dgc:ratio=0.001", "onebit", "randomk:ratio=0.05", "blocktopk:ratio=0.05"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

// Without device memory in the communicator, a CUDA tensor is staged once each way and counted.
TEST(DevicePathStaging, IsCountedWhenTheCommunicatorCannotTakeDeviceMemory) {
  const std::size_t n = 4096;
  run_ranks(2, [&](Communicator& comm) {
    auto codec = make_compressor("topk:ratio=0.1");
    DeviceArray<float> device(values_of(comm.rank(), 1, n, 0));
    const AllreduceStats stats =
        compressed_allreduce(comm, *codec, TensorView(device.data(), n, DType::kF32, Device::cuda(0)), "s");
    EXPECT_EQ(stats.staged_bytes, 2 * n * sizeof(float));
  });
}

// The fused Runtime on CUDA tensors (three tensors, one device fusion buffer, device_comm): same results and
// residuals as a Runtime on the host tensors.
TEST(DevicePathRuntime, FusedCudaTensorsMatchTheHostRuntime) {
  const std::vector<testing::RuntimeTensor> tensors = {{5000}, {70001}, {1234}};
  for (const char* spec : {"topk:ratio=0.05", "qsgd:bits=4", "fp16"}) {
    run_ranks(ranks(), [&](Communicator& comm) {
      const testing::RuntimePair run = testing::run_host_and_device_runtimes(comm, spec, tensors);
      EXPECT_EQ(run.device_stats.staged_bytes, 0u);
      std::string layout;  // every buffer's tensors and bytes, for the failure message
      for (const BufferRecord& buffer : run.device_stats.buffers) {
        layout += fmt::format(" [{} tensors, {} bytes, {}]", buffer.tensors, buffer.input_bytes, buffer.algorithm);
      }
      EXPECT_EQ(run.device_stats.buffers.back().tensors, tensors.size())
          << spec << ": the three CUDA tensors should share one buffer; buffers:" << layout;
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        EXPECT_EQ(std::memcmp(run.device[t].data(), run.host[t].data(), tensors[t].numel * sizeof(float)), 0)
            << spec << " tensor t" << t << " rank " << comm.rank();
      }
    });
  }
}

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
