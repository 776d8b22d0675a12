// Helpers of the device-path tests (device_path_gpu_test, powersgd_gpu_test): the same tensors through a fused
// Runtime on host memory and one on CUDA memory, ranks as threads over comm/local with a communicator that takes
// device memory around each (testing::through_host).
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tests/comm/through_host.h"
#include "gradcomp/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace gradcomp::testing {

// Normal(0, 1) values of tensor `tensor` of `rank` at `step`.
inline std::vector<float> values_of(int rank, std::size_t tensor, std::size_t n, int step) {
  std::mt19937 rng(static_cast<unsigned>(97 * rank + 13 * tensor + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// One tensor of a runtime comparison: f32, `numel` elements, first dimension `rows` (0: a vector).
struct RuntimeTensor {
  std::size_t numel = 0;
  std::size_t rows = 0;
};

// One rank's results of run_host_and_device_runtimes.
struct RuntimePair {
  std::vector<std::vector<float>> host, device;  // per tensor, after the last step
  RuntimeStats device_stats;                     // the device runtime's, after the last step
};

// `steps` steps of `spec` over `tensors` (named t0, t1, ...; step s gives tensor t the values values_of(rank, t,
// numel, s)): first through a Runtime on host tensors over `comm`, then through a Runtime on CUDA tensors (device 0,
// default stream) with device_comm = testing::through_host(comm). Cycles of 50 ms without idle back-off, so that
// each step's tensors meet in one fusion buffer in both runtimes.
inline RuntimePair run_host_and_device_runtimes(Communicator& comm, std::string_view spec,
                                                const std::vector<RuntimeTensor>& tensors, int steps = 1) {
  auto device_comm = testing::through_host(comm);
  RuntimeOptions host_options;
  host_options.timeline_path = "";
  host_options.cycle_time_ms = 50;
  host_options.idle_cycle_max_ms = 0;
  RuntimeOptions device_options = host_options;
  device_options.device_comm = device_comm.get();
  RuntimePair pair;
  pair.host.resize(tensors.size());
  {
    Runtime host_rt(comm, host_options);
    for (int step = 0; step < steps; ++step) {
      // Every input is ready before the first submission: one cycle sees all the tensors (one fusion buffer).
      for (std::size_t t = 0; t < tensors.size(); ++t) pair.host[t] = values_of(comm.rank(), t, tensors[t].numel, step);
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        host_rt.allreduce_async(fmt::format("t{}", t),
                                TensorView::of(std::span<float>(pair.host[t])).with_rows(tensors[t].rows), spec);
      }
      host_rt.synchronize();
    }
    host_rt.shutdown();
  }
  std::vector<std::unique_ptr<DeviceArray<float>>> device;
  for (const RuntimeTensor& tensor : tensors) device.push_back(std::make_unique<DeviceArray<float>>(tensor.numel));
  Runtime device_rt(comm, device_options);
  for (int step = 0; step < steps; ++step) {
    // Uploads first (a synchronous copy can outlast the 50 ms cycle and split the tensors over two buffers).
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      device[t]->upload(values_of(comm.rank(), t, tensors[t].numel, step));
    }
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      device_rt.allreduce_async(
          fmt::format("t{}", t),
          TensorView(device[t]->data(), tensors[t].numel, DType::kF32, Device::cuda(0)).with_rows(tensors[t].rows),
          spec);
    }
    device_rt.synchronize();
  }
  pair.device_stats = device_rt.stats();
  for (const auto& array : device) pair.device.push_back(array->download());
  return pair;
}

}  // namespace gradcomp::testing
