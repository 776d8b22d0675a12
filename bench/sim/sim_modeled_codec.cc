#include "bench/sim/sim_modeled_codec.h"

#include <mpi.h>
#include <smpi/smpi.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compressors/framework/payload.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp::sim {
namespace {

// Simulated seconds for `passes` passes over `numel` f32 values at `gbps` GB/s.
void charge(std::size_t numel, double passes, double gbps) {
  const double seconds = passes * 4.0 * static_cast<double>(numel) / (gbps * 1e9);
  if (seconds > 0) smpi_execute_benched(seconds);
}

// PowerSGD's two rounds (P = M Q: rows x rank, then Q = M^T P: cols x rank) with the matrix products charged as
// passes over M; the sums are real allreduces of the factor sizes.
class ModeledRounds final : public RoundReduction {
 public:
  ModeledRounds(std::size_t numel, std::size_t rows, std::size_t rank, double gbps)
      : numel_(numel), gbps_(gbps), p_(rows * rank), q_(rows > 0 ? numel / rows * rank : 0) {}
  std::span<float> next_round() override {
    if (round_ >= 2) return {};
    charge(numel_, 1, gbps_);  // one product with the matrix per round
    std::vector<float>& round = round_++ == 0 ? p_ : q_;
    return round;
  }
  void finish(bool) override { charge(numel_, 1, gbps_); }  // the decompression P Q^T
  std::size_t sent_bytes() const override { return (p_.size() + q_.size()) * sizeof(float); }

 private:
  std::size_t numel_;
  double gbps_;
  std::vector<float> p_, q_;
  int round_ = 0;
};

class ModeledCodec final : public Compressor {
 public:
  ModeledCodec(std::unique_ptr<Compressor> real, std::string name, double gbps, std::size_t rank)
      : real_(std::move(real)), name_(std::move(name)), gbps_(gbps), rank_(rank) {}

  std::string_view name() const override { return name_; }
  std::string spec() const override {
    const std::string real = real_->spec();
    const auto colon = real.find(':');
    return fmt::format("{}{}{}gbps={}", name_, colon == std::string::npos ? ":" : real.substr(colon),
                       colon == std::string::npos ? "" : ",", gbps_);
  }
  CompressorTraits traits() const override { return real_->traits(); }
  std::size_t max_payload_bytes(std::size_t numel) const override {
    if (!traits().summable) return real_->max_payload_bytes(numel);
    return payload::total_bytes(summable_header(numel));
  }
  std::size_t expected_payload_bytes(std::size_t numel, std::size_t rows) const override {
    if (!traits().summable) return real_->expected_payload_bytes(numel, rows);
    return max_payload_bytes(numel);
  }

  // Charges one pass and writes only the 64-byte header of a payload the size of the real codec's (its bound:
  // exact for these codecs after DGC's warm-up); the body is whatever the (folded) buffer holds.
  std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext&) override {
    const std::size_t numel = grad.numel();
    payload::Header header = summable_header(numel);
    if (!traits().summable) {
      const std::size_t bytes = real_->max_payload_bytes(numel);
      GRADCOMP_CHECK(bytes > payload::kHeaderBytes, "{}: no room for a body in {} bytes", name_, bytes);
      header.section_bytes[0] = bytes - payload::kHeaderBytes;
    }
    const std::size_t size = payload::total_bytes(header);
    GRADCOMP_CHECK(out.size() >= size, "{}: payload buffer of {} bytes, need {}", name_, out.size(), size);
    // Charged before the header is written: charging yields to the other simulated ranks, whose writes to their
    // folded buffers land in the same memory, and the dense algorithm reads the header back right after this call.
    charge(numel, 1, gbps_);
    payload::encode_header(header, out.first<payload::kHeaderBytes>());
    stats_.numel = numel;
    stats_.payload_bytes = size;
    return size;
  }
  // A dense or quantized payload is decoded in one pass over the output; a sparse one (gatherable: index-value
  // pairs) costs reading its pairs and scattering them, in proportion to the payload, not to the tensor.
  void decompress(PayloadBytes payload, const TensorView& out, DecodeMode) override {
    if (traits().gatherable) {
      charge(payload.bytes.size() / sizeof(float), 2, gbps_);
    } else {
      charge(out.numel(), 1, gbps_);
    }
  }
  std::unique_ptr<RoundReduction> begin_rounds(const TensorView& tensor, const CompressContext&) override {
    GRADCOMP_CHECK(traits().rounds && tensor.rows() > 0, "{}: rounds need a rounds codec and a matrix (--rows)", name_);
    return std::make_unique<ModeledRounds>(tensor.numel(), tensor.rows(), rank_, gbps_);
  }
  std::vector<std::byte> save_state() const override { return {}; }
  void load_state(std::span<const std::byte>) override {}
  void reset_state() override {}
  void set_threads(int) override {}
  CompressStats last_stats() const override { return stats_; }

 private:
  payload::Header summable_header(std::size_t numel) const {
    payload::Header header;
    header.numel = numel;
    header.section_count = 1;
    header.section_bytes[0] = numel * dtype_size(real_->traits().wire_dtype);
    return header;
  }

  std::unique_ptr<Compressor> real_;
  std::string name_;
  double gbps_;
  std::size_t rank_;
  CompressStats stats_;
};

void register_modeled(Registry& registry, const std::string& real_name) {
  CompressorInfo real = registry.info(real_name);
  CompressorInfo info = real;
  info.name = "sim_" + real_name;
  info.summary = fmt::format("{} with its work modeled as simulated time (bench/sim)", real_name);
  info.positional = {};
  info.params.push_back(ParamSpec{"gbps", ParamSpec::Kind::kFloat, "1000", 0.0, 1e9, true, {},
                                  "codec throughput per pass over the tensor, GB/s of f32 input"});
  info.factory = [real_name, name = info.name](const Params& params) -> std::unique_ptr<Compressor> {
    std::string spec = real_name;
    char sep = ':';
    for (const auto& [key, value] : params.values()) {
      if (key == "gbps") continue;
      spec += fmt::format("{}{}={}", sep, key, value);
      sep = ',';
    }
    const std::size_t rank = params.has("rank") ? static_cast<std::size_t>(params.get_int("rank")) : 0;
    return std::make_unique<ModeledCodec>(make_compressor(spec), name, params.get_float("gbps"), rank);
  };
  registry.add(std::move(info));
}

}  // namespace

void register_modeled_codecs() {
  Registry& registry = default_registry();
  for (const char* name : {"none", "fp16", "qsgd", "topk", "dgc", "powersgd"}) {
    if (!registry.contains(std::string("sim_") + name)) register_modeled(registry, name);
  }
}

}  // namespace gradcomp::sim
