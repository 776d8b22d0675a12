// PowerSGD through compressed_allreduce on any communicator (comm/local threads or MPI ranks): every rank's result
// against the independent reference (tests/compressors/powersgd_reference.h) over several steps with warm start and
// error feedback, a fused call (matrices and a vector as segments) against separate calls, and the sum op.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "compressors/framework/state_io.h"
#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "tests/comm/allreduce_check.h"
#include "tests/compressors/powersgd_reference.h"

namespace gradcomp::testing {

inline void check_powersgd_steps(Communicator& comm, std::size_t rows, std::size_t cols, std::size_t rank,
                                 ReduceOp op) {
  const int n = comm.size();
  auto codec = make_compressor(fmt::format("powersgd:rank={}", rank));
  PowerSgdReference ref("layer.weight", rows, cols, rank, n);
  for (std::uint64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < n; ++r) grads.push_back(make_gradient(rows * cols, r, step, 7));
    const auto expected = ref.step(grads, step, op == ReduceOp::kAverage);
    std::vector<float> tensor = grads[comm.rank()];
    AllreduceOptions options;
    options.op = op;
    options.step = step;
    const auto stats = compressed_allreduce(
        comm, *codec, TensorView(tensor.data(), tensor.size(), DType::kF32).with_rows(rows), "layer.weight", options);
    EXPECT_EQ(stats.algorithm, AllreduceAlgorithm::kRounds);
    EXPECT_EQ(stats.payload_bytes, rank * (rows + cols) * sizeof(float));
    EXPECT_LT(relative_error(tensor, expected), 1e-4 * n)
        << fmt::format("rank {} of {}, step {}, {}x{} rank {}", comm.rank(), n, step, rows, cols, rank);
    const auto all = gather_floats(comm, tensor);
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(std::memcmp(all.data(), all.data() + r * tensor.size(), tensor.size() * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0 at step " << step;
    }
  }
}

inline void check_powersgd_fused_equals_separate(Communicator& comm) {
  const std::size_t a = 30 * 50, v = 17, b = 24 * 24;
  auto fused_codec = make_compressor("powersgd:rank=2");
  auto separate_codec = make_compressor("powersgd:rank=2");
  for (std::uint64_t step = 0; step < 2; ++step) {
    std::vector<float> fused = make_gradient(a + v + b, comm.rank(), step, 11);
    std::vector<float> wa(fused.begin(), fused.begin() + a), wv(fused.begin() + a, fused.begin() + a + v),
        wb(fused.begin() + a + v, fused.end());
    const std::vector<TensorSegment> segments = {
        {"a", 0, a, 0, 0, 30}, {"v", a, v, 0, 0, 0}, {"b", a + v, b, 0, 0, 24}};
    AllreduceOptions options;
    options.step = step;
    options.segments = segments;
    compressed_allreduce(comm, *fused_codec, TensorView::of(std::span<float>(fused)), "bucket0", options);
    AllreduceOptions single;
    single.step = step;
    compressed_allreduce(comm, *separate_codec, TensorView::of(std::span<float>(wa)).with_rows(30), "a", single);
    compressed_allreduce(comm, *separate_codec, TensorView::of(std::span<float>(wv)), "v", single);
    compressed_allreduce(comm, *separate_codec, TensorView::of(std::span<float>(wb)).with_rows(24), "b", single);
    std::vector<float> joined = wa;
    joined.insert(joined.end(), wv.begin(), wv.end());
    joined.insert(joined.end(), wb.begin(), wb.end());
    std::vector<double> expected(joined.begin(), joined.end());
    EXPECT_LT(relative_error(fused, expected), 1e-5) << "step " << step << " rank " << comm.rank();
  }
  // The fused call kept its state under the matrices' own names (the vector has none), not the bucket's.
  const auto state = fused_codec->save_state();
  ByteReader reader(state, "test");
  std::vector<std::string> names;
  for (auto count = read_state_envelope(reader, "powersgd"); count > 0; --count) {
    names.push_back(read_state_record(reader).name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b"}));
}

}  // namespace gradcomp::testing
