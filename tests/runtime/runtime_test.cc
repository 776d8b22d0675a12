// The fusion runtime on comm/local (ranks as threads): ordering, fusion, mismatches, shutdown, error
// feedback across fusion changes, callbacks, auto policy, two runtimes in one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <mutex>
#include <atomic>
#include <cmath>
#include <fstream>
#include <latch>
#include <numeric>
#include <random>
#include <latch>
#include <set>
#include <sstream>
#include <thread>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"
#include "tests/comm/sum_bound.h"
#include "tests/runtime/json_check.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

RuntimeOptions quiet_options(std::size_t threshold = std::size_t{64} << 20) {
  RuntimeOptions options;
  options.fusion_threshold_bytes = threshold;
  options.timeline_path = "";
  options.cycle_time_ms = 1;
  return options;
}

// Small integers: sums and the division by a power-of-two rank count are exact.
float value_of(int rank, int tensor, std::size_t i) {
  return static_cast<float>((rank + 1) * 3 + tensor % 17 + static_cast<int>(i % 11));
}

TEST(Runtime, TwoHundredTensorsInDifferentOrdersCompleteCorrectly) {
  constexpr int kTensors = 200;
  constexpr std::size_t kNumel = 2560;  // 10 KB
  constexpr int kRanks = 4;
  run_ranks(kRanks, [&](Communicator& comm) {
    Runtime rt(comm, quiet_options());
    std::vector<std::vector<float>> data(kTensors, std::vector<float>(kNumel));
    for (int t = 0; t < kTensors; ++t) {
      for (std::size_t i = 0; i < kNumel; ++i) data[t][i] = value_of(comm.rank(), t, i);
    }
    std::vector<int> order(kTensors);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(1234 + comm.rank());
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Handle> handles(kTensors);
    for (int t : order) {
      handles[t] = rt.allreduce_async(fmt::format("layer{}.weight", t), TensorView::of(std::span<float>(data[t])));
      if (t % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // arrivals spread over cycles
    }
    for (int t = 0; t < kTensors; ++t) rt.wait(handles[t]);
    for (int t = 0; t < kTensors; ++t) {
      for (std::size_t i = 0; i < kNumel; ++i) {
        float expected = 0;
        for (int r = 0; r < kRanks; ++r) expected += value_of(r, t, i);
        ASSERT_EQ(data[t][i], expected / kRanks) << "tensor " << t << " element " << i;
      }
    }
    const RuntimeStats stats = rt.stats();
    EXPECT_EQ(stats.tensors, static_cast<std::uint64_t>(kTensors));
    EXPECT_LT(stats.messages, static_cast<std::uint64_t>(kTensors) / 5) << "fusion should batch the tensors";
    EXPECT_EQ(stats.input_bytes, kTensors * kNumel * sizeof(float));
  });
}

// Rank `rank`'s tensors of `sizes` at `step` (normal values; every rank can rebuild every rank's).
std::vector<std::vector<float>> step_inputs(int rank, int step, const std::vector<std::size_t>& sizes) {
  std::mt19937 rng(77 + 1000 * rank + step);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> data(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    data[t].resize(sizes[t]);
    for (float& v : data[t]) v = normal(rng);
  }
  return data;
}

// Runs `steps` of allreduce over `sizes` with fusion threshold `threshold`; returns the results of the last step.
std::vector<std::vector<float>> reduce_steps(Communicator& comm, const std::string& spec, std::size_t threshold,
                                             const std::vector<std::size_t>& sizes, int steps) {
  Runtime rt(comm, quiet_options(threshold));
  std::vector<std::vector<float>> data(sizes.size());
  for (int step = 0; step < steps; ++step) {
    data = step_inputs(comm.rank(), step, sizes);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      rt.allreduce_async(fmt::format("t{}", t), TensorView::of(std::span<float>(data[t])), spec);
    }
    rt.synchronize();
  }
  return data;
}

TEST(Runtime, FusedAndUnfusedIdenticalForSummableCodecs) {
  const std::vector<std::size_t> sizes = {1, 1000, 3, 70000, 257, 4096, 12};
  for (const std::string spec : {"none", "fp16", "bf16"}) {
    SCOPED_TRACE(spec);
    bool registered = true;
    try {
      make_compressor(spec);
    } catch (const InvalidArgument&) {
      registered = false;  // codec from another branch not merged in this build
    }
    if (!registered) continue;
    run_ranks(3, [&](Communicator& comm) {
      const auto fused = reduce_steps(comm, spec, std::size_t{64} << 20, sizes, 2);
      const auto unfused = reduce_steps(comm, spec, 0, sizes, 2);
      // The last step's average of every rank's input, within the wire dtype's sum bound (sum_bound.h) over the
      // terms of both steps (with error feedback the second step also sends what the first one's rounding kept).
      const DType wire = make_compressor(spec)->traits().wire_dtype;
      std::vector<std::vector<std::vector<float>>> inputs[2];
      for (int r = 0; r < comm.size(); ++r) {
        for (int step = 0; step < 2; ++step) inputs[step].push_back(step_inputs(r, step, sizes));
      }
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          double exact = 0, magnitude = 0;
          for (int r = 0; r < comm.size(); ++r) {
            exact += inputs[1][r][t][i];
            magnitude += std::fabs(inputs[1][r][t][i]) + 2 * std::fabs(inputs[0][r][t][i]);
          }
          const double n = comm.size();
          const double bound = testing::sum_error_bound(wire, comm.size(), magnitude / n, /*rounded_inputs=*/true);
          ASSERT_LE(std::fabs(fused[t][i] - exact / n), bound) << "tensor " << t << " element " << i;
        }
      }
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        ASSERT_EQ(fused[t].size(), unfused[t].size());
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(fused[t][i]), std::bit_cast<std::uint32_t>(unfused[t][i]))
              << "tensor " << t << " element " << i;
        }
      }
    });
  }
}

TEST(Runtime, SameNameDifferentSizesRaisesOnEveryRankAndRuntimeGoesOn) {
  std::atomic<int> raised{0};
  run_ranks(3, [&](Communicator& comm) {
    Runtime rt(comm, quiet_options());
    std::vector<float> x(comm.rank() == 1 ? 200 : 100, 1.0f);
    Handle h = rt.allreduce_async("fc.weight", TensorView::of(std::span<float>(x)));
    try {
      rt.wait(h);
      ADD_FAILURE() << "rank " << comm.rank() << " did not raise";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("fc.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("f32[100]"), std::string::npos) << what;
      EXPECT_NE(what.find("f32[200]"), std::string::npos) << what;
      ++raised;
    }
    // The runtime keeps working after the failed tensor.
    std::vector<float> y(10, static_cast<float>(comm.rank()));
    rt.wait(rt.allreduce_async("fc.weight", TensorView::of(std::span<float>(y))));
    EXPECT_EQ(y[0], 1.0f);  // (0 + 1 + 2) / 3
  });
  EXPECT_EQ(raised.load(), 3);
}

TEST(Runtime, ShutdownWithPendingWorkNeitherHangsNorLeaks) {
  std::atomic<int> callbacks{0};
  const auto start = std::chrono::steady_clock::now();
  run_ranks(2, [&](Communicator& comm) {
    auto rt = std::make_unique<Runtime>(comm, quiet_options());
    std::vector<std::vector<float>> data(20, std::vector<float>(1000, 1.0f));
    std::vector<Handle> handles;
    for (int t = 0; t < 20; ++t) {
      handles.push_back(rt->allreduce_async(fmt::format("g{}", t), TensorView::of(std::span<float>(data[t]))));
    }
    std::vector<float> lonely(10, 1.0f);
    rt->allreduce_async(fmt::format("only_on_rank{}", comm.rank()), TensorView::of(std::span<float>(lonely)), "",
                        [&](const Status& status) {
                          EXPECT_FALSE(status.ok());
                          ++callbacks;
                        });
    rt->shutdown();  // no wait: submitted-everywhere work is drained, the rest fails
    for (Handle h : handles) rt->wait(h);
    for (auto& d : data) EXPECT_EQ(d[0], 1.0f);
    EXPECT_THROW(rt->allreduce_async("late", TensorView::of(std::span<float>(lonely))), InvalidArgument);
    EXPECT_EQ(rt->stats().tensors, 21u);
    rt.reset();  // destructor after shutdown: idempotent
  });
  EXPECT_EQ(callbacks.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  // The destructor alone also drains and stops.
  run_ranks(2, [&](Communicator& comm) {
    std::vector<float> x(100, 2.0f);
    Runtime rt(comm, quiet_options());
    rt.allreduce_async("x", TensorView::of(std::span<float>(x)), "", [](const Status& s) { EXPECT_TRUE(s.ok()); });
  });
}

TEST(Runtime, TensorSubmittedByOneRankTimesOut) {
  std::atomic<bool> orphan_done{false};
  run_ranks(2, [&](Communicator& comm) {
    RuntimeOptions options = quiet_options();
    options.timeout = std::chrono::milliseconds(300);
    Runtime rt(comm, options);
    if (comm.rank() == 0) {
      std::vector<float> x(10, 1.0f);
      Handle h = rt.allreduce_async("orphan", TensorView::of(std::span<float>(x)));
      try {
        rt.wait(h);
        ADD_FAILURE() << "no timeout";
      } catch (const Timeout& e) {
        EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
      }
      orphan_done = true;
    } else {
      while (!orphan_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<float> y(10, 1.0f);
    rt.wait(rt.allreduce_async("both", TensorView::of(std::span<float>(y))));
  });
}

class Residuals : public ::testing::TestWithParam<const char*> {};

TEST_P(Residuals, StayRightWhenFusionThresholdChanges) {
  const std::string spec = GetParam();
  // Per name and element: sum over steps of the averaged results + average over ranks of the final residual must
  // equal the average over ranks of the summed gradients (nothing lost, nothing counted twice), whatever the grouping.
  const std::vector<std::size_t> sizes = {3000, 500, 12000, 64, 2500};
  constexpr int kRanks = 2, kSteps = 6;
  std::vector<std::vector<double>> result_sum(sizes.size()), grad_sum(sizes.size()), residual_sum(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    result_sum[t].assign(sizes[t], 0);
    grad_sum[t].assign(sizes[t], 0);
    residual_sum[t].assign(sizes[t], 0);
  }
  std::mutex mutex;
  run_ranks(kRanks, [&](Communicator& comm) {
    RuntimeOptions options = quiet_options(0);
    // The result must be the average of what the ranks transmitted (scatter-reduce-allgather re-quantizes the sums,
    // which this identity does not see): allgather for every codec.
    options.algorithm = AllreduceAlgorithm::kAllgather;
    Runtime rt(comm, options);
    const std::size_t thresholds[kSteps] = {0, 1 << 20, 10000, 40000, 0, 1 << 20};
    for (int step = 0; step < kSteps; ++step) {
      rt.set_fusion_threshold(thresholds[step]);
      std::mt19937 rng(5 + 100 * comm.rank() + step);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<std::vector<float>> data(sizes.size());
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        data[t].resize(sizes[t]);
        for (float& v : data[t]) v = normal(rng);
        std::lock_guard lock(mutex);
        for (std::size_t i = 0; i < sizes[t]; ++i) grad_sum[t][i] += data[t][i] / kRanks;
      }
      // Arrival order changes every step, too.
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t t = (k + step) % sizes.size();
        rt.allreduce_async(fmt::format("p{}", t), TensorView::of(std::span<float>(data[t])), spec);
      }
      rt.synchronize();
      if (comm.rank() == 0) {
        std::lock_guard lock(mutex);
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          for (std::size_t i = 0; i < sizes[t]; ++i) result_sum[t][i] += data[t][i];
        }
      }
    }
    const RuntimeStats stats = rt.stats();
    std::set<std::size_t> group_sizes;
    for (const auto& buffer : stats.buffers) group_sizes.insert(buffer.tensors);
    EXPECT_GE(group_sizes.size(), 3u) << "the threshold changes should change the grouping";
    std::lock_guard lock(mutex);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const std::vector<float> r = rt.residual(fmt::format("p{}", t));
      ASSERT_EQ(r.size(), sizes[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) residual_sum[t][i] += r[i] / kRanks;
    }
  });
  double residual_norm = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      ASSERT_NEAR(result_sum[t][i] + residual_sum[t][i], grad_sum[t][i], 1e-4) << "tensor " << t << " element " << i;
      residual_norm += std::abs(residual_sum[t][i]);
    }
  }
  EXPECT_GT(residual_norm, 1.0) << "the lossy codec should have left residuals";
}

// topk: one payload per buffer (sparse allreduce); qsgd: per-chunk payloads (scatter-reduce-allgather).
INSTANTIATE_TEST_SUITE_P(Codecs, Residuals, ::testing::Values("topk:ratio=0.05", "qsgd:bits=4"),
                         [](const auto& info) { return std::string(info.param).substr(0, 4); });

TEST(Runtime, ScatterReduceAllgatherCodecThroughFusion) {
  // qsgd runs scatter-reduce-allgather: its chunks are compressed from the fusion buffer with each tensor's residual
  // (cut at chunk boundaries), the re-quantized sums keep the owner's residual. The result stays close to the true
  // average.
  run_ranks(3, [&](Communicator& comm) {
    Runtime rt(comm, quiet_options());
    std::vector<std::vector<float>> data(4, std::vector<float>(3001));
    for (int t = 0; t < 4; ++t) {
      for (std::size_t i = 0; i < data[t].size(); ++i) data[t][i] = std::sin(0.01f * i + t) * (comm.rank() + 1);
      rt.allreduce_async(fmt::format("q{}", t), TensorView::of(std::span<float>(data[t])), "qsgd:bits=8");
    }
    rt.synchronize();
    for (int t = 0; t < 4; ++t) {
      for (std::size_t i = 0; i < data[t].size(); ++i) ASSERT_NEAR(data[t][i], 2 * std::sin(0.01f * i + t), 0.08);
      EXPECT_EQ(rt.residual(fmt::format("q{}", t)).size(), 3001u);
    }
    EXPECT_EQ(rt.stats().buffers.at(0).algorithm, "sra");
  });
}

TEST(Runtime, CallbacksAndPolicyRules) {
  std::latch dup_tried(1);
  run_ranks(2, [&](Communicator& comm) {
    RuntimeOptions options = quiet_options();
    options.policy.rules = {{"*.bias", "none"}};
    options.policy.default_spec = "topk:ratio=0.01";
    options.policy.min_compress_bytes = 4096;
    Runtime rt(comm, options);
    std::vector<float> bias(5000, 1.0f), small(100, 1.0f), weight(5000, 1.0f);
    std::atomic<int> done{0};
    auto count = [&](const Status& status) {
      EXPECT_TRUE(status.ok()) << status.message();
      ++done;
    };
    rt.allreduce_async("fc.bias", TensorView::of(std::span<float>(bias)), "", count);
    rt.allreduce_async("fc.small", TensorView::of(std::span<float>(small)), "", count);
    rt.allreduce_async("fc.weight", TensorView::of(std::span<float>(weight)), "", count);
    rt.synchronize();
    EXPECT_EQ(done.load(), 3);
    std::set<std::string> specs;
    for (const auto& buffer : rt.stats().buffers) specs.insert(buffer.spec.substr(0, buffer.spec.find(':')));
    EXPECT_EQ(specs, (std::set<std::string>{"none", "topk"}));
    EXPECT_TRUE(rt.residual("fc.bias").empty());
    EXPECT_EQ(rt.residual("fc.weight").size(), 5000u);
    std::vector<float> x(10, 1.0f);
    // Rank 1 submits "dup" only after rank 0 has tried twice, so rank 0's first "dup" is surely still pending.
    if (comm.rank() == 1) dup_tried.wait();
    Handle h = rt.allreduce_async("dup", TensorView::of(std::span<float>(x)));
    if (comm.rank() == 0) {
      EXPECT_THROW(rt.allreduce_async("dup", TensorView::of(std::span<float>(x))), InvalidArgument);
      dup_tried.count_down();
    }
    rt.wait(h);
    EXPECT_THROW(rt.wait(h), InvalidArgument);  // already waited
    EXPECT_THROW(rt.allreduce_async("bad", TensorView::of(std::span<float>(x)), "nosuchcodec"), InvalidArgument);
  });
}

TEST(Runtime, AutoPicksCompressionOnlyWhenItPays) {
  for (double link : {1e6, 1e14}) {
    run_ranks(2, [&](Communicator& comm) {
      RuntimeOptions options = quiet_options();
      options.policy.default_spec = "auto";
      options.policy.auto_candidates = {"topk:ratio=0.01"};
      options.link_bytes_per_s = link;
      Runtime rt(comm, options);
      std::vector<float> x(1 << 18, 1.0f);
      rt.wait(rt.allreduce_async("big", TensorView::of(std::span<float>(x))));
      const RuntimeStats stats = rt.stats();
      ASSERT_EQ(stats.buffers.size(), 1u);
      const BufferRecord& record = stats.buffers[0];
      EXPECT_TRUE(record.auto_chosen);
      EXPECT_GT(record.dense_predicted_s, 0);
      if (link < 1e9) {
        EXPECT_EQ(record.spec.substr(0, 4), "topk") << record.spec;
        EXPECT_LT(record.predicted_s, record.dense_predicted_s);
      } else {
        EXPECT_EQ(record.spec.substr(0, 4), "none") << record.spec;
        EXPECT_EQ(record.predicted_s, record.dense_predicted_s);
      }
    });
  }
}

TEST(Runtime, TensorLimitKeepsLargeTensorsOutOfFusion) {
  run_ranks(2, [&](Communicator& comm) {
    RuntimeOptions options = quiet_options();
    options.fusion_tensor_limit_bytes = 1000;
    Runtime rt(comm, options);
    std::vector<std::vector<float>> data = {std::vector<float>(100, 1.0f), std::vector<float>(100, 2.0f),
                                            std::vector<float>(1000, 3.0f), std::vector<float>(100, 4.0f)};
    for (std::size_t t = 0; t < data.size(); ++t) {
      rt.allreduce_async(fmt::format("x{}", t), TensorView::of(std::span<float>(data[t])));
    }
    rt.synchronize();
    std::multiset<std::size_t> members;
    for (const auto& buffer : rt.stats().buffers) members.insert(buffer.tensors);
    // The 4000-byte tensor alone; the three small ones fused (in one buffer, or split across cycles).
    EXPECT_EQ(rt.stats().tensors, 4u);
    EXPECT_TRUE(members.count(1) >= 1);
    for (const auto& buffer : rt.stats().buffers) {
      if (buffer.input_bytes == 4000) {
        EXPECT_EQ(buffer.tensors, 1u);
      }
      if (buffer.tensors > 1) {
        EXPECT_LE(buffer.input_bytes, 1200u);
      }
    }
    EXPECT_EQ(data[2][0], 3.0f);
  });
}

TEST(Runtime, TwoRuntimesInOneProcess) {
  auto group_a = make_local_communicators(2, std::chrono::seconds(30));
  auto group_b = make_local_communicators(2, std::chrono::seconds(30));
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      // One application thread drives both runtimes of its rank.
      Runtime a(*group_a[r], quiet_options());
      Runtime b(*group_b[r], quiet_options(0));
      std::vector<float> xa(1000, static_cast<float>(r)), xb(1000, static_cast<float>(10 * r));
      Handle ha = a.allreduce_async("shared.name", TensorView::of(std::span<float>(xa)));
      Handle hb = b.allreduce_async("shared.name", TensorView::of(std::span<float>(xb)), "topk:ratio=1");
      a.wait(ha);
      b.wait(hb);
      if (xa[0] == 0.5f && xb[999] == 5.0f) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 2);
}

}  // namespace
}  // namespace gradcomp
