// The powersgd codec: parameters, per-tensor state (save/load in the common envelope), the rounds reduction that
// compressed_allreduce drives, and the one-rank payload of compress()/decompress().
#include "compressors/codecs/powersgd.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "compressors/framework/payload.h"
#include "compressors/codecs/powersgd_codec.h"
#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"

namespace gradcomp {
namespace {

using powersgd::Block;
using powersgd::Options;
using powersgd::Step;

constexpr std::size_t kBlockRecordBytes = 24;  // u64 offset, u64 numel, u32 rows, u32 rank

std::vector<ParamSpec> powersgd_params() {
  std::vector<ParamSpec> params = {
      {"rank", ParamSpec::Kind::kInt, "1", 1, 4096, false, {}, "rank R of the approximation P Q^T"},
      {"warm_start", ParamSpec::Kind::kBool, "on", 0, 0, false, {},
       "start each step's power iteration from the last step's Q (else a fresh random Q)"},
      {"start_step", ParamSpec::Kind::kInt, "0", 0, 9007199254740991.0, false, {},
       "steps before this one are reduced uncompressed (dense, no error feedback)"},
      {"min_compression_rate", ParamSpec::Kind::kFloat, "2", 0, 1e9, false, {},
       "a matrix is compressed only if rank*(rows+cols)*rate < rows*cols; others travel uncompressed"},
      {"orth_eps", ParamSpec::Kind::kFloat, "0", 0, 1, false, {},
       "orthonormalization divides each column by (norm + orth_eps)"},
      {"seed", ParamSpec::Kind::kInt, "0", 0, 9007199254740991.0, false, {},
       "seed of the initial random Q (must be equal on every rank)"},
  };
  for (auto& common : lossy_common_params()) params.push_back(std::move(common));
  return params;
}

CompressorTraits powersgd_traits() {
  CompressorTraits traits;
  traits.rounds = true;
  traits.lossy = true;
  return traits;
}

std::unique_ptr<LowRankOps> ops_for(const TensorView& tensor, int threads) {
  return tensor.device().is_cuda() ? cuda_lowrank_ops(tensor) : host_lowrank_ops(threads);
}

class PowerSgdCompressor;

// compressed_allreduce's rounds: P (with the uncompressed values), then Q.
class PowerSgdReduction final : public RoundReduction {
 public:
  PowerSgdReduction(std::unique_ptr<LowRankOps> ops, const Options& options, powersgd::StateMap& states,
                    powersgd::Scratch& scratch, const TensorView& tensor, const CompressContext& ctx)
      : ops_(std::move(ops)), step_(options, states, scratch, *ops_, tensor, ctx, /*tensor_writable=*/true) {}

  std::span<float> next_round() override {
    if (phase_ == 0) {
      phase_ = 1;
      if (!step_.round1().empty()) return step_.round1();
    }
    if (phase_ == 1) {
      phase_ = 2;
      if (step_.has_round2()) {
        step_.compute_round2();
        return step_.round2();
      }
    }
    phase_ = 3;
    return {};
  }
  void finish(bool average) override {
    GRADCOMP_CHECK(phase_ == 3, "powersgd: finish() before the last round");
    step_.complete(average);
    phase_ = 4;
  }
  std::size_t sent_bytes() const override { return step_.sent_floats() * sizeof(float); }
  ~PowerSgdReduction() override {
    if (phase_ == 4) return;
    try {
      ops_->synchronize();  // a failed round: let the queued passes finish before the scratch is reused
    } catch (...) {
      // The device failed too: nothing to wait for.
    }
  }

 private:
  std::unique_ptr<LowRankOps> ops_;
  Step step_;
  int phase_ = 0;
};

class PowerSgdCompressor final : public Compressor {
 public:
  explicit PowerSgdCompressor(const Params& params) : params_(params), specs_(powersgd_params()) {
    options_.rank = static_cast<std::size_t>(params.get_int("rank"));
    options_.warm_start = params.get_bool("warm_start");
    options_.start_step = static_cast<std::uint64_t>(params.get_int("start_step"));
    options_.min_compression_rate = params.get_float("min_compression_rate");
    options_.orth_eps = static_cast<float>(params.get_float("orth_eps"));
    options_.seed = static_cast<std::uint64_t>(params.get_int("seed"));
    options_.ef = params.get_bool("ef");
    options_.nonfinite = parse_nonfinite_policy(params.get_string("nonfinite"));
  }

  std::string_view name() const override { return "powersgd"; }
  std::string spec() const override { return params_.canonical(specs_); }
  CompressorTraits traits() const override { return powersgd_traits(); }

  std::size_t max_payload_bytes(std::size_t numel) const override {
    // Blocks hold >= 4 elements; a block's factors are < 2x its elements (rank < min(rows, cols)); the rest is dense.
    return payload::kHeaderBytes + 3 * payload::kSectionAlign + kBlockRecordBytes * (numel / 4) +
           2 * numel * sizeof(float);
  }

  // One matrix's factors (rank x (rows + cols) floats) when its shape compresses, else the tensor travels dense.
  std::size_t expected_payload_bytes(std::size_t numel, std::size_t rows) const override {
    const std::size_t cols = rows == 0 ? 0 : numel / rows;
    const bool matrix = rows > 1 && cols > 1 && rows * cols == numel && options_.rank < std::min(rows, cols);
    const std::size_t rank = matrix ? powersgd::block_rank(options_, "", rows, cols, 0) : 0;
    const std::size_t floats = rank > 0 ? rank * (rows + cols) : numel;
    return payload::kHeaderBytes + 3 * payload::kSectionAlign + kBlockRecordBytes + floats * sizeof(float);
  }

  std::unique_ptr<RoundReduction> begin_rounds(const TensorView& tensor, const CompressContext& ctx) override {
    auto ops = ops_for(tensor, threads_);
    powersgd::Scratch& scratch = scratch_[ops->device()];
    return std::make_unique<PowerSgdReduction>(std::move(ops), options_, states_, scratch, tensor, ctx);
  }

  std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx) override {
    GRADCOMP_CHECK(grad.device().is_cpu(),
                   "powersgd: compress() of '{}' takes host tensors, got {} (compressed_allreduce keeps CUDA tensors "
                   "on the device with the rounds algorithm)",
                   ctx.name, grad.describe());
    auto ops = host_lowrank_ops(threads_);
    CompressContext local = ctx;
    local.world_size = 1;
    Step step(options_, states_, scratch_[-1], *ops, grad, local, /*tensor_writable=*/false);
    if (step.has_round2()) step.compute_round2();
    const std::size_t size = write_payload(step, grad, out, ctx);
    step.complete(std::nullopt);
    stats_ = CompressStats{};
    stats_.numel = grad.numel();
    stats_.payload_bytes = size;
    stats_.selected = step.sent_floats();
    for (const Block& block : step.blocks()) stats_.skipped = stats_.skipped || block.skipped;
    return size;
  }

  void decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) override;

  std::vector<std::byte> save_state() const override;
  void load_state(std::span<const std::byte> bytes) override;
  void reset_state() override { states_.clear(); }
  void set_threads(int threads) override { threads_ = threads; }
  CompressStats last_stats() const override { return stats_; }

 private:
  std::size_t write_payload(Step& step, const TensorView& grad, std::span<std::byte> out,
                            const CompressContext& ctx) const;

  Params params_;
  std::vector<ParamSpec> specs_;
  Options options_;
  powersgd::StateMap states_;
  std::map<int, powersgd::Scratch> scratch_;  // by device (-1: host)
  int threads_ = 0;
  CompressStats stats_;
};

std::size_t PowerSgdCompressor::write_payload(Step& step, const TensorView& grad, std::span<std::byte> out,
                                              const CompressContext& ctx) const {
  std::vector<std::byte> layout;
  std::size_t factor_floats = 0, dense_floats = 0;
  for (const Block& block : step.blocks()) {
    if (block.rank == 0) {
      dense_floats += block.numel;
      continue;
    }
    factor_floats += block.rank * (block.rows + block.cols);
    const std::uint64_t offset = block.offset, numel = block.numel;
    const auto rows = static_cast<std::uint32_t>(block.rows), rank = static_cast<std::uint32_t>(block.rank);
    const std::size_t at = layout.size();
    layout.resize(at + kBlockRecordBytes);
    std::memcpy(layout.data() + at, &offset, 8);
    std::memcpy(layout.data() + at + 8, &numel, 8);
    std::memcpy(layout.data() + at + 16, &rows, 4);
    std::memcpy(layout.data() + at + 20, &rank, 4);
  }
  payload::Header header;
  header.codec = payload::CodecId::kPowerSgd;
  header.numel = grad.numel();
  header.dtype = grad.dtype();
  header.param0 = static_cast<std::uint32_t>(options_.rank);
  header.param1 = static_cast<std::uint32_t>(layout.size() / kBlockRecordBytes);
  header.section_count = 3;
  header.section_bytes = {layout.size(), factor_floats * sizeof(float), dense_floats * sizeof(float), 0};
  GRADCOMP_CHECK(out.size() >= payload::total_bytes(header),
                 "powersgd: payload buffer of {} bytes for tensor '{}' is smaller than the {} bytes needed",
                 out.size(), ctx.name, payload::total_bytes(header));
  const std::size_t size = payload::write_header(header, out);
  if (!layout.empty()) std::memcpy(out.data() + payload::section_offset(header, 0), layout.data(), layout.size());
  auto* factors = reinterpret_cast<float*>(out.data() + payload::section_offset(header, 1));
  auto* dense = reinterpret_cast<float*>(out.data() + payload::section_offset(header, 2));
  const float* round1 = step.round1().data();
  const float* round2 = step.round2().data();
  for (const Block& block : step.blocks()) {
    if (block.numel == 0) continue;  // an empty tensor: its rounds may have no storage at all (null data)
    if (block.rank == 0) {
      std::memcpy(dense, round1 + block.p_offset, block.numel * sizeof(float));
      dense += block.numel;
      continue;
    }
    std::memcpy(factors, round1 + block.p_offset, block.rank * block.rows * sizeof(float));
    factors += block.rank * block.rows;
    std::memcpy(factors, round2 + block.q_offset, block.rank * block.cols * sizeof(float));
    factors += block.rank * block.cols;
  }
  return size;
}

void PowerSgdCompressor::decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) {
  GRADCOMP_CHECK(out.device().is_cpu(), "powersgd: decompress() writes host tensors, got {}", out.describe());
  GRADCOMP_CHECK(payload.memory.is_host(), "powersgd: decompress() reads host payloads, got one in {} memory",
                 device_name(payload.memory.device));
  const std::span<const std::byte> bytes = payload.bytes;
  const payload::View view = payload::parse(bytes, payload::CodecId::kPowerSgd, static_cast<long long>(out.numel()));
  const std::size_t numel = out.numel();
  const std::size_t blocks = view.header.param1;
  GRADCOMP_CHECK_AS(CorruptPayload, view.header.section_count == 3 && view.sections[0].size() == blocks * 24,
                    "corrupt powersgd payload: {} blocks but a {}-byte layout", blocks, view.sections[0].size());
  struct Record {
    std::uint64_t offset, numel;
    std::uint32_t rows, rank;
  };
  std::vector<Record> records(blocks);
  std::size_t end = 0, factor_floats = 0, covered = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    Record& r = records[b];
    const std::byte* at = view.sections[0].data() + b * kBlockRecordBytes;
    std::memcpy(&r.offset, at, 8);
    std::memcpy(&r.numel, at + 8, 8);
    std::memcpy(&r.rows, at + 16, 4);
    std::memcpy(&r.rank, at + 20, 4);
    const bool valid = r.offset >= end && r.numel <= numel && r.offset <= numel - r.numel && r.rows > 0 &&
                       r.numel % r.rows == 0 && r.rank > 0 && r.rank < r.rows && r.rank < r.numel / r.rows;
    GRADCOMP_CHECK_AS(CorruptPayload, valid,
                      "corrupt powersgd payload: block {} (offset {}, {} elements, {} rows, rank {}) is out of order "
                      "or out of range of {} elements",
                      b, r.offset, r.numel, r.rows, r.rank, numel);
    end = r.offset + r.numel;
    covered += r.numel;
    factor_floats += static_cast<std::size_t>(r.rank) * (r.rows + r.numel / r.rows);
  }
  GRADCOMP_CHECK_AS(CorruptPayload,
                    view.sections[1].size() == factor_floats * sizeof(float) &&
                        view.sections[2].size() == (numel - covered) * sizeof(float),
                    "corrupt powersgd payload: sections of {} and {} bytes, expected {} and {}",
                    view.sections[1].size(), view.sections[2].size(), factor_floats * sizeof(float),
                    (numel - covered) * sizeof(float));
  auto ops = host_lowrank_ops(threads_);
  const bool accumulate = mode == DecodeMode::kAccumulate;
  std::vector<float> factors(factor_floats), dense(numel - covered), product;
  if (factor_floats) std::memcpy(factors.data(), view.sections[1].data(), view.sections[1].size());
  if (!dense.empty()) std::memcpy(dense.data(), view.sections[2].data(), view.sections[2].size());
  std::size_t cursor = 0, dense_cursor = 0, position = 0;
  auto write_dense = [&](std::size_t until) {
    if (until > position) {
      ops->store_f32(dense.data() + dense_cursor, 1.0f, out, position, until - position, accumulate);
      dense_cursor += until - position;
    }
  };
  for (const Record& r : records) {
    write_dense(r.offset);
    const std::size_t rows = r.rows, cols = r.numel / r.rows, rank = r.rank;
    const float* p = factors.data() + cursor;
    const float* q = p + rank * rows;
    if (out.dtype() == DType::kF32) {  // P Q^T straight into the output (beta 1 adds)
      ops->gemm(true, false, rows, cols, rank, 1.0f, p, rows, q, cols, accumulate ? 1.0f : 0.0f,
                static_cast<float*>(out.data()) + r.offset, cols);
    } else {
      product.resize(r.numel);
      ops->gemm(true, false, rows, cols, rank, 1.0f, p, rows, q, cols, 0.0f, product.data(), cols);
      ops->store_f32(product.data(), 1.0f, out, r.offset, r.numel, accumulate);
    }
    cursor += rank * (rows + cols);
    position = r.offset + r.numel;
  }
  write_dense(numel);
}

std::vector<std::byte> PowerSgdCompressor::save_state() const {
  ByteWriter writer;
  std::size_t count = 0;
  for (const auto& entry : states_) count += entry.second.numel != 0;
  write_state_envelope(writer, "powersgd", count);
  for (const auto& [tensor, state] : states_) {
    if (state.numel == 0) continue;
    auto ops = state.device < 0 ? host_lowrank_ops(1)
                                : cuda_lowrank_ops(TensorView(nullptr, 0, DType::kF32, Device::cuda(state.device)));
    std::vector<std::vector<float>> buffers(2);
    buffers[0].resize(state.residual.size());
    if (state.q_valid) buffers[1].resize(state.q.size());
    ops->download(buffers[0].data(), state.residual.data(), buffers[0].size());
    ops->download(buffers[1].data(), state.q.data(), buffers[1].size());
    const std::vector<double> scalars = {static_cast<double>(state.rows)};
    write_state_record(writer, tensor, state.numel, state.steps, buffers, scalars);
  }
  return writer.take();
}

void PowerSgdCompressor::load_state(std::span<const std::byte> bytes) {
  ByteReader reader(bytes, "'powersgd' compressor state");
  const auto count = read_state_envelope(reader, "powersgd");
  powersgd::StateMap loaded;
  auto ops = host_lowrank_ops(1);
  for (std::uint64_t t = 0; t < count; ++t) {
    StateRecord record = read_state_record(reader);
    GRADCOMP_CHECK(record.buffers.size() == 2 && record.scalars.size() == 1,
                   "state of tensor '{}' has {} buffers and {} scalars; powersgd keeps 2 and 1", record.name,
                   record.buffers.size(), record.scalars.size());
    const auto rows = static_cast<std::uint64_t>(record.scalars[0]);
    GRADCOMP_CHECK(rows > 0 && record.numel % rows == 0,
                   "state of tensor '{}': {} elements in {} rows is not a matrix", record.name, record.numel, rows);
    const std::size_t cols = record.numel / rows;
    const auto& residual = record.buffers[0];
    const auto& q = record.buffers[1];
    GRADCOMP_CHECK(residual.empty() || residual.size() == record.numel,
                   "state of tensor '{}' has a residual of {} values, expected {}", record.name, residual.size(),
                   record.numel);
    GRADCOMP_CHECK(q.size() % cols == 0, "state of tensor '{}' has a Q of {} values, not a multiple of {} columns",
                   record.name, q.size(), cols);
    powersgd::TensorState state;
    state.numel = record.numel;
    state.rows = rows;
    state.steps = record.steps;
    if (options_.ef && !residual.empty()) {
      state.residual = ops->allocate(residual.size());
      ops->upload(state.residual.data(), residual.data(), residual.size());
    }
    // A Q kept for another rank is drawn afresh (rank is a parameter: a checkpoint may be resumed with another).
    if (!q.empty() && q.size() == options_.rank * cols) {
      state.q = ops->allocate(q.size());
      ops->upload(state.q.data(), q.data(), q.size());
      state.q_valid = true;
    }
    loaded.emplace(std::move(record.name), std::move(state));
  }
  GRADCOMP_CHECK_AS(CorruptPayload, reader.at_end(), "corrupt compressor state: {} trailing bytes", reader.remaining());
  states_ = std::move(loaded);
}

}  // namespace

CompressorInfo powersgd_compressor_info() {
  CompressorInfo info;
  info.name = "powersgd";
  info.summary = "PowerSGD: rank-R approximation P Q^T by one shared power iteration per step (two summable rounds)";
  info.traits = powersgd_traits();
  info.params = powersgd_params();
  info.factory = [](const Params& params) -> std::unique_ptr<Compressor> {
    return std::make_unique<PowerSgdCompressor>(params);
  };
  return info;
}

}  // namespace gradcomp
