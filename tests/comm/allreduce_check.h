// Shared by the comm/local and MPI allreduce tests: runs compressed_allreduce on one rank and checks it against a
// reference rebuilt from what the ranks' compressors transmitted (a twin compressor with the same spec and history
// produces the same payloads; they are exchanged with plain allgatherv and decoded), and that all ranks end
// bit-identical.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"

namespace gradcomp::testing {

// Deterministic pseudo-random gradient of rank `rank` at `step` (mixed signs and magnitudes, a few exact zeros).
inline std::vector<float> make_gradient(std::size_t numel, int rank, std::uint64_t step, std::uint64_t salt = 0) {
  std::vector<float> values(numel);
  std::uint64_t state = 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(rank) + 1) + step * 1315423911ull + salt;
  for (std::size_t i = 0; i < numel; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(state >> 11) / 9007199254740992.0;  // [0, 1)
    values[i] = (i % 97 == 5) ? 0.0f : static_cast<float>((u - 0.5) * std::pow(10.0, 3.0 * u - 2.0));
  }
  return values;
}

// Allgather of equal-size float vectors.
inline std::vector<float> gather_floats(Communicator& comm, const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * comm.size());
  comm.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
  return all;
}

// Allgatherv of byte vectors; returns the blocks in rank order.
inline std::vector<std::vector<std::byte>> gather_bytes(Communicator& comm, const std::vector<std::byte>& mine) {
  std::uint64_t size = mine.size();
  std::vector<std::uint64_t> sizes(comm.size());
  comm.allgather(std::as_bytes(std::span(&size, 1)), std::as_writable_bytes(std::span(sizes)));
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::vector<std::byte> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  comm.allgatherv(mine, counts, all);
  std::vector<std::vector<std::byte>> blocks;
  std::size_t offset = 0;
  for (std::size_t c : counts) {
    blocks.emplace_back(all.begin() + offset, all.begin() + offset + c);
    offset += c;
  }
  return blocks;
}

inline std::vector<std::byte> twin_compress(Compressor& twin, std::span<const float> values, std::string_view name,
                                            std::uint64_t step, const Communicator& comm, float prescale,
                                            std::span<const TensorSegment> segments = {}) {
  CompressContext ctx;
  ctx.name = name;
  ctx.segments = segments;
  ctx.step = step;
  ctx.rank = comm.rank();
  ctx.world_size = comm.size();
  ctx.prescale = prescale;
  std::vector<std::byte> out(twin.payload_bound(values.size(), segments));
  out.resize(twin.compress(TensorView(const_cast<float*>(values.data()), values.size(), DType::kF32), out, ctx));
  return out;
}

inline std::vector<float> decode(Compressor& codec, const std::vector<std::byte>& payload, std::size_t numel) {
  std::vector<float> out(numel);
  codec.decompress(payload, TensorView(out.data(), numel, DType::kF32), DecodeMode::kOverwrite);
  return out;
}

inline std::size_t chunk_begin(std::size_t numel, int i, int n) { return numel * i / n; }

// The reference of one step: what the algorithm must produce from what the twins transmitted.
inline std::vector<float> reference_step(Communicator& comm, Compressor& twin, const std::vector<float>& grad,
                                         const std::string& name, std::uint64_t step, AllreduceAlgorithm algorithm,
                                         ReduceOp op) {
  const int n = comm.size();
  const std::size_t numel = grad.size();
  const float divisor = op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
  std::vector<float> ref(numel, 0.0f);
  if (algorithm != AllreduceAlgorithm::kScatterReduceAllgather) {
    const float prescale = algorithm == AllreduceAlgorithm::kDense ? 1.0f / divisor : 1.0f;
    const auto payloads = gather_bytes(comm, twin_compress(twin, grad, name, step, comm, prescale));
    for (int r = 0; r < n; ++r) {
      const auto decoded = decode(twin, payloads[r], numel);
      for (std::size_t i = 0; i < numel; ++i) ref[i] += decoded[i];
    }
    if (algorithm != AllreduceAlgorithm::kDense && op == ReduceOp::kAverage && n > 1) {
      for (float& v : ref) v /= divisor;
    }
    return ref;
  }
  // SRA: chunk payloads of every rank (chunk i: elements [b, e) of the tensor, compressed as that part of it), the
  // owner's reduction + recompression (by the owner's twin), decoded.
  std::vector<std::vector<std::vector<std::byte>>> chunks(n);  // chunks[i][s]: rank s's payload of chunk i
  for (int i = 0; i < n; ++i) {
    const std::size_t b = chunk_begin(numel, i, n), e = chunk_begin(numel, i + 1, n);
    const TensorSegment part{name, 0, e - b, b, numel};
    chunks[i] = gather_bytes(comm, twin_compress(twin, std::span(grad).subspan(b, e - b),
                                                 fmt::format("{}#chunk{}", name, i), step, comm, 1.0f,
                                                 std::span(&part, 1)));
  }
  const int me = comm.rank();
  const std::size_t b = chunk_begin(numel, me, n), e = chunk_begin(numel, me + 1, n);
  std::vector<float> sum(e - b, 0.0f);
  for (int s = 0; s < n; ++s) {
    const auto decoded = decode(twin, chunks[me][s], e - b);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += decoded[i];
  }
  if (op == ReduceOp::kAverage && n > 1) {
    for (float& v : sum) v /= divisor;
  }
  const auto reduced = gather_bytes(comm, twin_compress(twin, sum, fmt::format("{}#sra{}", name, me), step, comm, 1.0f));
  for (int r = 0; r < n; ++r) {
    const std::size_t rb = chunk_begin(numel, r, n), re = chunk_begin(numel, r + 1, n);
    const auto decoded = decode(twin, reduced[r], re - rb);
    std::copy(decoded.begin(), decoded.end(), ref.begin() + rb);
  }
  return ref;
}

// Runs `steps` compressed allreduces of `spec` on this rank and checks every step. Returns the last stats.
inline AllreduceStats check_allreduce(Communicator& comm, const std::string& spec, AllreduceAlgorithm algorithm,
                                      std::size_t numel, int steps = 2, ReduceOp op = ReduceOp::kAverage,
                                      double sparse_switch_density = 1.0) {
  auto compressor = make_compressor(spec);
  auto twin = make_compressor(spec);
  const CompressorTraits traits = compressor->traits();
  const AllreduceAlgorithm resolved = resolve_algorithm(traits, algorithm);
  const std::string name = fmt::format("grad.{}", numel);
  AllreduceStats stats;
  for (int step = 0; step < steps; ++step) {
    const auto grad = make_gradient(numel, comm.rank(), step);
    std::vector<float> tensor = grad;
    AllreduceOptions options;
    options.algorithm = algorithm;
    options.op = op;
    options.step = step;
    options.sparse_switch_density = sparse_switch_density;
    stats = compressed_allreduce(comm, *compressor, TensorView(tensor.data(), numel, DType::kF32), name, options);
    EXPECT_EQ(stats.algorithm, resolved);
    EXPECT_EQ(stats.input_bytes, numel * 4);
    const auto ref = reference_step(comm, *twin, grad, name, step, resolved, op);

    // Tolerance: summation order (f32) or the wire dtype's rounding of a half-precision sum.
    double scale = 0;
    for (float v : ref) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    double rel = 1e-5 * comm.size();
    if (resolved == AllreduceAlgorithm::kDense && traits.wire_dtype != DType::kF32) {
      rel = (traits.wire_dtype == DType::kF16 ? 2e-3 : 1.6e-2) * comm.size();
    }
    const double tolerance = rel * scale + 1e-30;
    std::size_t wrong = 0;
    double max_error = 0;
    for (std::size_t i = 0; i < numel; ++i) {
      const double error = std::fabs(static_cast<double>(tensor[i]) - ref[i]);
      max_error = std::max(max_error, error);
      if (!(error <= tolerance)) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << fmt::format("spec {} algorithm {} ranks {} numel {} step {} rank {}: max error {} > {}",
                                        spec, algorithm_name(resolved), comm.size(), numel, step, comm.rank(),
                                        max_error, tolerance);
    // Bit-identical on every rank.
    const auto all = gather_floats(comm, tensor);
    for (int r = 1; r < comm.size(); ++r) {
      EXPECT_TRUE(numel == 0 || std::memcmp(all.data(), all.data() + r * numel, numel * sizeof(float)) == 0)
          << fmt::format("spec {} algorithm {}: rank {} differs from rank 0 (numel {}, step {})", spec,
                         algorithm_name(resolved), r, numel, step);
    }
  }
  return stats;
}

// Default spec of every registered codec (the codecs on other branches join automatically when merged).
inline std::vector<std::string> registered_specs() {
  std::vector<std::string> specs;
  for (const auto& info : default_registry().list()) specs.push_back(info.name);
  return specs;
}

}  // namespace gradcomp::testing
