// The device-resident path on one GPU, with ranks as threads: compressed_allreduce and the fused Runtime on CUDA
// tensors over a communicator that takes device memory (the in-process backend behind comm::stage_device_memory)
// give the same bits as the host path on the same inputs, never stage the tensor, and a CUDA tensor on a
// communicator without device memory is staged once per call and counted. Without a CUDA device: SKIPPED (77).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "comm/device_staging.h"
#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp {
namespace {

using testing::DeviceArray;
using testing::run_ranks;

constexpr int kRanks = 3;

std::vector<float> values_of(int rank, std::size_t tensor, std::size_t n, int step) {
  std::mt19937 rng(static_cast<unsigned>(97 * rank + 13 * tensor + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

class DevicePath : public ::testing::TestWithParam<const char*> {};

// Two steps of compressed_allreduce (error feedback carried) on the device and on the host: same bits, every rank.
TEST_P(DevicePath, CompressedAllreduceMatchesTheHostBitForBit) {
  const std::string spec = GetParam();
  const std::size_t n = 300007;  // every grid-stride loop runs more than once
  std::vector<std::vector<float>> host_results(kRanks), device_results(kRanks);
  std::mutex mutex;
  run_ranks(kRanks, [&](Communicator& comm) {
    auto host_codec = make_compressor(spec);
    auto device_codec = make_compressor(spec);
    auto device_comm = comm::stage_device_memory(comm);
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
        std::lock_guard lock(mutex);
        host_results[comm.rank()] = host;
        device_results[comm.rank()] = device.download();
      }
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(device_results[r].size(), host_results[r].size());
    EXPECT_EQ(std::memcmp(device_results[r].data(), host_results[r].data(), n * sizeof(float)), 0)
        << spec << ": rank " << r << " differs from the host path";
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, DevicePath,
                         ::testing::Values("none", "fp16", "qsgd:bits=4", "topk:ratio=0.01", "dgc:ratio=0.001",
                                           "onebit", "randomk:ratio=0.05", "blocktopk:ratio=0.05"),
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
  const std::vector<std::size_t> sizes = {5000, 70001, 1234};
  for (const char* spec : {"topk:ratio=0.05", "qsgd:bits=4", "fp16"}) {
    run_ranks(kRanks, [&](Communicator& comm) {
      auto device_comm = comm::stage_device_memory(comm);
      RuntimeOptions host_options;
      host_options.timeline_path = "";
      host_options.cycle_time_ms = 50;
      host_options.idle_cycle_max_ms = 0;
      RuntimeOptions device_options = host_options;
      device_options.device_comm = device_comm.get();
      Runtime host_rt(comm, host_options);
      std::vector<std::vector<float>> host(sizes.size());
      std::vector<std::unique_ptr<DeviceArray<float>>> device;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        host[t] = values_of(comm.rank(), t, sizes[t], 0);
        device.push_back(std::make_unique<DeviceArray<float>>(host[t]));
        host_rt.allreduce_async(fmt::format("t{}", t), TensorView::of(std::span<float>(host[t])), spec);
      }
      host_rt.synchronize();
      host_rt.shutdown();
      Runtime device_rt(comm, device_options);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        device_rt.allreduce_async(fmt::format("t{}", t),
                                  TensorView(device[t]->data(), sizes[t], DType::kF32, Device::cuda(0)), spec);
      }
      device_rt.synchronize();
      const RuntimeStats stats = device_rt.stats();
      EXPECT_EQ(stats.staged_bytes, 0u);
      EXPECT_EQ(stats.buffers.back().tensors, sizes.size()) << "the three CUDA tensors should share one buffer";
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const auto got = device[t]->download();
        EXPECT_EQ(std::memcmp(got.data(), host[t].data(), sizes[t] * sizeof(float)), 0)
            << spec << " tensor t" << t << " rank " << comm.rank();
      }
    });
  }
}

}  // namespace
}  // namespace gradcomp

GRADCOMP_GPU_TEST_MAIN()
