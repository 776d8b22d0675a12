#include "src/runtime/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "src/runtime/policy.h"

namespace gradcomp::runtime {
namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One compress() call of the collective on (a slice of) the fusion buffer: what this rank transmitted there.
struct Captured {
  std::size_t offset = 0;  // elements from the buffer start
  std::size_t numel = 0;
  float prescale = 1.0f;
  std::vector<std::byte> payload;
};

// Forwards everything to `inner`; keeps a copy of every payload compressed from the fusion buffer itself (the whole
// buffer, or its chunks under scatter-reduce-allgather), so the runtime learns what this rank transmitted without
// compressing twice. Compressions of other memory (SRA's re-quantized sums) are not captured.
class CapturingCompressor final : public Compressor {
 public:
  // `inner` compresses the fusion buffer (and its chunks); `other` (may equal inner) everything else, e.g. the
  // re-quantized partial sums of scatter-reduce-allgather, which keep the codec's own error feedback.
  CapturingCompressor(Compressor& inner, Compressor& other, const TensorView& target, bool capture)
      : inner_(inner), other_(other), target_(target), capture_(capture) {}

  std::string_view name() const override { return inner_.name(); }
  std::string spec() const override { return inner_.spec(); }
  CompressorTraits traits() const override { return inner_.traits(); }
  std::size_t max_payload_bytes(std::size_t numel) const override { return inner_.max_payload_bytes(numel); }
  std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx) override {
    const auto* base = static_cast<const std::byte*>(target_.data());
    const auto* at = static_cast<const std::byte*>(grad.data());
    const std::size_t elem = dtype_size(target_.dtype());
    const bool mine = grad.numel() > 0 && grad.dtype() == target_.dtype() && at >= base &&
                      at + grad.bytes() <= base + target_.bytes();
    if (!mine) return other_.compress(grad, out, ctx);
    const std::size_t size = inner_.compress(grad, out, ctx);
    if (capture_) {
      Captured captured;
      captured.offset = static_cast<std::size_t>(at - base) / elem;
      captured.numel = grad.numel();
      captured.prescale = ctx.prescale;
      captured.payload.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(size));
      covered_ += grad.numel();
      captures_.push_back(std::move(captured));
    }
    return size;
  }
  void decompress(std::span<const std::byte> payload, const TensorView& out, DecodeMode mode) override {
    inner_.decompress(payload, out, mode);
  }
  std::vector<std::byte> save_state() const override { return inner_.save_state(); }
  void load_state(std::span<const std::byte> state) override { inner_.load_state(state); }
  void reset_state() override { inner_.reset_state(); }
  void set_threads(int threads) override { inner_.set_threads(threads); }
  CompressStats last_stats() const override { return inner_.last_stats(); }

  // True when the captured slices cover the buffer exactly once.
  bool complete() const { return covered_ == target_.numel(); }
  const std::vector<Captured>& captures() const { return captures_; }

 private:
  Compressor& inner_;
  Compressor& other_;
  TensorView target_;
  bool capture_;
  std::vector<Captured> captures_;
  std::size_t covered_ = 0;
};

bool ef_requested(std::string_view spec) {
  const Params params = default_registry().validate(spec);
  return params.has("ef") && params.get_bool("ef");
}

}  // namespace

double AutoModel::predict_dense(std::size_t bytes, int world) const {
  if (world <= 1 || link_bytes_per_s <= 0) return 0;
  return 2.0 * (world - 1) / world * static_cast<double>(bytes) / link_bytes_per_s;
}

double AutoModel::predict(const Candidate& c, std::size_t bytes, int world) const {
  const double b = static_cast<double>(bytes);
  const double payload = b * c.payload_ratio;
  double wire = 0, decode = b / c.decompress_bytes_per_s;
  if (c.traits.summable) {
    wire = 2.0 * (world - 1) / world * payload;
  } else if (c.traits.gatherable) {
    wire = (world - 1) * payload;
    decode *= world;
  } else {
    wire = 2.0 * (world - 1) / world * payload;
    decode *= 2;
  }
  const double link = world <= 1 || link_bytes_per_s <= 0 ? 0 : wire / link_bytes_per_s;
  return b / c.compress_bytes_per_s + link + decode;
}

Executor::Executor(Communicator& comm, const RuntimeOptions& options, Timeline* timeline)
    : comm_(comm), options_(options), timeline_(timeline) {}

Codec& Executor::codec_for(const std::string& spec, DType dtype) {
  const bool want_ef = spec != kAutoSpec && ef_requested(spec);
  auto probe = default_registry().info(parse_spec(spec).name).traits;
  bool runtime_ef = want_ef && probe.lossy && dtype == DType::kF32;
  auto it = codecs_.find(fmt::format("{}|{}", spec, runtime_ef));
  if (it != codecs_.end()) return it->second;
  if (runtime_ef && codecs_.count(fmt::format("{}|false", spec)) != 0) {
    return codecs_.at(fmt::format("{}|false", spec));  // a codec without ef=off (dgc), found before
  }
  Codec codec;
  codec.spec = spec;
  if (runtime_ef) {
    try {
      codec.compressor = make_compressor(with_error_feedback(spec, false));
    } catch (const InvalidArgument&) {
      // The codec has no ef=off (DGC: its accumulator is the error feedback). It keeps its own state, keyed by the
      // buffer name, so fusible() sends such tensors alone under their own names.
      runtime_ef = false;
      if (auto found = codecs_.find(fmt::format("{}|false", spec)); found != codecs_.end()) return found->second;
    }
  }
  const std::string key = fmt::format("{}|{}", spec, runtime_ef);
  codec.runtime_ef = runtime_ef;
  if (!codec.compressor) codec.compressor = make_compressor(spec);
  if (runtime_ef) codec.second = make_compressor(spec);
  codec.traits = codec.compressor->traits();
  return codecs_.emplace(key, std::move(codec)).first->second;
}

bool Executor::fusible(const Signature& signature) {
  if (signature.spec == kAutoSpec) return true;
  // A lossy codec with error feedback that the runtime cannot take over (f16/bf16 tensors, codecs without ef=off)
  // keys its residual by the name it is given: such tensors travel alone, under their own names.
  const Codec& codec = codec_for(signature.spec, signature.dtype);
  return codec.runtime_ef || !(codec.traits.lossy && ef_requested(signature.spec));
}

void Executor::calibrate() {
  const int world = comm_.size();
  std::vector<std::string> specs;
  for (const std::string& spec : options_.policy.auto_candidates) specs.push_back(canonical_spec(spec));
  // Measured on rank 0, broadcast so that every rank predicts the same and picks the same codec.
  std::vector<double> numbers(1 + 3 * specs.size(), 0.0);
  constexpr std::size_t kProbe = 1 << 20;
  std::vector<float> probe(kProbe), out(kProbe);
  std::uint32_t state = 12345;
  for (float& v : probe) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<std::int32_t>(state >> 8) - (1 << 23)) * 1e-7f;
  }
  if (options_.link_bytes_per_s > 0) {
    numbers[0] = options_.link_bytes_per_s;
  } else if (world > 1) {
    std::vector<float> dense(kProbe * 2, 1.0f);
    double best = 1e30;
    for (int i = 0; i < 2; ++i) {
      const auto start = Clock::now();
      comm_.allreduce(TensorView::of(std::span<float>(dense)), ReduceOp::kSum);
      best = std::min(best, seconds_since(start));
    }
    numbers[0] = 2.0 * (world - 1) / world * static_cast<double>(dense.size() * sizeof(float)) / best;
  }
  if (comm_.rank() == 0) {
    for (std::size_t c = 0; c < specs.size(); ++c) {
      auto compressor = make_compressor(with_error_feedback(specs[c], false));
      std::vector<std::byte> payload(compressor->max_payload_bytes(kProbe));
      CompressContext ctx;
      ctx.name = "gradcomp.auto.probe";
      double compress_s = 1e30, decompress_s = 1e30;
      std::size_t size = 0;
      for (int i = 0; i < 2; ++i) {
        auto start = Clock::now();
        size = compressor->compress(TensorView::of(std::span<float>(probe)), payload, ctx);
        compress_s = std::min(compress_s, seconds_since(start));
        start = Clock::now();
        compressor->decompress(std::span<const std::byte>(payload.data(), size), TensorView::of(std::span<float>(out)),
                               DecodeMode::kOverwrite);
        decompress_s = std::min(decompress_s, seconds_since(start));
      }
      const double bytes = kProbe * sizeof(float);
      numbers[1 + 3 * c] = bytes / std::max(compress_s, 1e-9);
      numbers[2 + 3 * c] = bytes / std::max(decompress_s, 1e-9);
      numbers[3 + 3 * c] = static_cast<double>(size) / bytes;
    }
  }
  if (world > 1) {
    comm_.broadcast(std::as_writable_bytes(std::span<double>(numbers)), 0);
  }
  model_.link_bytes_per_s = numbers[0];
  model_.candidates.clear();
  for (std::size_t c = 0; c < specs.size(); ++c) {
    AutoModel::Candidate candidate;
    candidate.spec = specs[c];
    candidate.compress_bytes_per_s = numbers[1 + 3 * c];
    candidate.decompress_bytes_per_s = numbers[2 + 3 * c];
    candidate.payload_ratio = numbers[3 + 3 * c];
    candidate.traits = default_registry().info(parse_spec(specs[c]).name).traits;
    model_.candidates.push_back(candidate);
  }
  model_.ready = true;
}

std::string Executor::choose_auto(std::size_t bytes, BufferRecord& record) {
  if (!model_.ready) calibrate();
  const int world = comm_.size();
  record.auto_chosen = true;
  record.dense_predicted_s = model_.predict_dense(bytes, world);
  std::string best = canonical_spec("none");
  double best_s = record.dense_predicted_s;
  for (const auto& candidate : model_.candidates) {
    const double predicted = model_.predict(candidate, bytes, world);
    if (predicted < best_s) {
      best_s = predicted;
      best = candidate.spec;
    }
  }
  record.predicted_s = best_s;
  return best;
}

std::vector<float> Executor::residual(const std::string& name) const {
  std::lock_guard lock(residual_mutex_);
  auto it = residuals_.find(name);
  return it == residuals_.end() ? std::vector<float>{} : it->second;
}

namespace {
constexpr std::uint32_t kCodecMagic = 0x43455845;  // "EXEC"
}  // namespace

void Executor::save_state(ByteWriter& writer) const {
  writer.put<std::uint32_t>(kCodecMagic);
  writer.put<std::uint64_t>(codecs_.size());
  for (const auto& [key, codec] : codecs_) {
    writer.put_string(codec.spec);
    writer.put<std::uint8_t>(codec.runtime_ef ? 1 : 0);
    const std::vector<std::byte> state = codec.compressor->save_state();
    writer.put_array(std::span<const std::byte>(state));
    const std::vector<std::byte> second = codec.second ? codec.second->save_state() : std::vector<std::byte>{};
    writer.put_array(std::span<const std::byte>(second));
  }
  {
    std::lock_guard lock(residual_mutex_);
    writer.put<std::uint64_t>(residuals_.size());
    for (const auto& [name, residual] : residuals_) {
      writer.put_string(name);
      auto spec = residual_specs_.find(name);
      writer.put_string(spec == residual_specs_.end() ? std::string() : spec->second);
      writer.put_array(std::span<const float>(residual));
    }
  }
  writer.put<std::uint64_t>(steps_.size());
  for (const auto& [name, step] : steps_) {
    writer.put_string(name);
    writer.put<std::uint64_t>(step);
  }
  writer.put<std::uint8_t>(model_.ready ? 1 : 0);
  writer.put<double>(model_.link_bytes_per_s);
  writer.put<std::uint64_t>(model_.candidates.size());
  for (const auto& candidate : model_.candidates) {
    writer.put_string(candidate.spec);
    writer.put<double>(candidate.compress_bytes_per_s);
    writer.put<double>(candidate.decompress_bytes_per_s);
    writer.put<double>(candidate.payload_ratio);
  }
}

std::map<std::string, Executor::ResidualShape> Executor::load_state(ByteReader& reader) {
  GRADCOMP_CHECK_AS(CorruptPayload, reader.get<std::uint32_t>() == kCodecMagic,
                    "corrupt runtime state on rank {}: bad executor section marker", comm_.rank());
  // Everything is built aside first; the executor changes only once all of it parsed and loaded.
  std::map<std::string, Codec> codecs;
  const auto codec_count = reader.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < codec_count; ++i) {
    Codec codec;
    codec.spec = reader.get_string();
    const auto flag = reader.get<std::uint8_t>();
    GRADCOMP_CHECK_AS(CorruptPayload, flag <= 1, "corrupt runtime state on rank {}: codec flag {}", comm_.rank(),
                      flag);
    codec.runtime_ef = flag == 1;
    const auto state = reader.get_array<std::byte>();
    const auto second = reader.get_array<std::byte>();
    codec.compressor = make_compressor(codec.runtime_ef ? with_error_feedback(codec.spec, false) : codec.spec);
    codec.compressor->load_state(state);
    if (codec.runtime_ef) {
      codec.second = make_compressor(codec.spec);
      codec.second->load_state(second);
    } else {
      GRADCOMP_CHECK_AS(CorruptPayload, second.empty(),
                        "corrupt runtime state on rank {}: codec '{}' has a second state but no second instance",
                        comm_.rank(), codec.spec);
    }
    codec.traits = codec.compressor->traits();
    const std::string key = fmt::format("{}|{}", codec.spec, codec.runtime_ef);
    GRADCOMP_CHECK_AS(CorruptPayload, codecs.count(key) == 0, "corrupt runtime state on rank {}: codec '{}' twice",
                      comm_.rank(), key);
    codecs.emplace(key, std::move(codec));
  }
  std::map<std::string, std::vector<float>, std::less<>> residuals;
  std::map<std::string, std::string> residual_specs;
  std::map<std::string, ResidualShape> shapes;
  const auto residual_count = reader.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < residual_count; ++i) {
    std::string name = reader.get_string();
    std::string spec = reader.get_string();
    std::vector<float> residual = reader.get_array<float>();
    shapes[name] = ResidualShape{residual.size(), spec};
    if (!spec.empty()) residual_specs[name] = spec;
    GRADCOMP_CHECK_AS(CorruptPayload, residuals.emplace(std::move(name), std::move(residual)).second,
                      "corrupt runtime state on rank {}: a residual name appears twice", comm_.rank());
  }
  std::map<std::string, std::uint64_t> steps;
  const auto step_count = reader.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < step_count; ++i) {
    std::string name = reader.get_string();
    steps[name] = reader.get<std::uint64_t>();
  }
  AutoModel model;
  const auto ready = reader.get<std::uint8_t>();
  GRADCOMP_CHECK_AS(CorruptPayload, ready <= 1, "corrupt runtime state on rank {}: auto flag {}", comm_.rank(), ready);
  model.ready = ready == 1;
  model.link_bytes_per_s = reader.get<double>();
  const auto candidate_count = reader.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < candidate_count; ++i) {
    AutoModel::Candidate candidate;
    candidate.spec = reader.get_string();
    candidate.compress_bytes_per_s = reader.get<double>();
    candidate.decompress_bytes_per_s = reader.get<double>();
    candidate.payload_ratio = reader.get<double>();
    candidate.traits = default_registry().info(parse_spec(candidate.spec).name).traits;
    model.candidates.push_back(std::move(candidate));
  }
  codecs_ = std::move(codecs);
  {
    std::lock_guard lock(residual_mutex_);
    residuals_ = std::move(residuals);
    residual_specs_ = std::move(residual_specs);
  }
  steps_ = std::move(steps);
  model_ = std::move(model);
  return shapes;
}

BufferRecord Executor::execute(const FusionGroup& group, const std::vector<const ReadyTensor*>& members,
                               const std::vector<TensorView>& tensors) {
  BufferRecord record;
  record.tensors = members.size();
  record.input_bytes = group.bytes;
  std::string spec = group.spec;
  if (spec == kAutoSpec) spec = group.dtype == DType::kF32 ? choose_auto(group.bytes, record) : canonical_spec("none");
  Codec& codec = codec_for(spec, group.dtype);
  record.spec = codec.compressor->spec();
  if (codec.runtime_ef) record.spec = with_error_feedback(record.spec, true);

  const bool single = members.size() == 1;
  const std::string buffer_name =
      single ? members[0]->name
             : fmt::format("fused[{}+{}]#{}", members[0]->name, members.size() - 1, group.numel);
  const std::size_t elem = dtype_size(group.dtype);
  const bool f32 = group.dtype == DType::kF32;
  // Residuals are folded in for f32 tensors: kept (lossy ef=on) or dropped after folding (anything else).
  const bool fold = f32;

  // Copy in: v = g + r(name); r(name) := v when the runtime keeps error feedback.
  auto copy_start = Clock::now();
  TensorView buffer = single ? tensors[0]
                             : TensorView(arena_.get(group.bytes), group.numel, group.dtype, tensors[0].device());
  {
    std::lock_guard lock(residual_mutex_);
    for (std::size_t m = 0; m < members.size(); ++m) {
      const TensorView& t = tensors[m];
      std::byte* dst = static_cast<std::byte*>(buffer.data()) + group.offsets[m] * elem;
      auto it = fold ? residuals_.find(members[m]->name) : residuals_.end();
      if (it != residuals_.end() && it->second.size() != t.numel()) {
        residuals_.erase(it);  // the name now has another size: its old residual means nothing for it
        residual_specs_.erase(members[m]->name);
        it = residuals_.end();
      }
      if (it == residuals_.end() && codec.runtime_ef) {
        it = residuals_.emplace(members[m]->name, std::vector<float>(t.numel(), 0.0f)).first;
      }
      if (codec.runtime_ef) residual_specs_[members[m]->name] = codec.spec;
      if (it == residuals_.end()) {
        if (!single) std::memcpy(dst, t.data(), t.bytes());
        continue;
      }
      const float* g = static_cast<const float*>(t.data());
      float* v = reinterpret_cast<float*>(dst);
      float* r = it->second.data();
      for (std::size_t i = 0; i < t.numel(); ++i) {
        const float value = g[i] + r[i];
        v[i] = value;
        r[i] = value;
      }
      if (!codec.runtime_ef) {  // transmitted exactly: nothing left over
        residual_specs_.erase(it->first);
        residuals_.erase(it);
      }
    }
  }
  auto copy_end = Clock::now();
  record.copy_in_s = std::chrono::duration<double>(copy_end - copy_start).count();
  if (timeline_ && !single) timeline_->event("copy_in", "fusion", 1, copy_start, copy_end);

  // One compressed allreduce over the buffer.
  // Payloads are copied only when the runtime needs them for error feedback (a dense payload is as big as the buffer).
  CapturingCompressor capturing(*codec.compressor, codec.second ? *codec.second : *codec.compressor, buffer,
                                codec.runtime_ef);
  AllreduceOptions options;
  options.op = options_.op;
  options.verify = false;  // names, sizes and specs were negotiated
  options.algorithm = options_.algorithm;
  options.step = steps_[buffer_name]++;
  const auto call_start = Clock::now();
  AllreduceStats stats = compressed_allreduce(comm_, capturing, buffer, buffer_name, options);
  const auto call_end = Clock::now();
  record.algorithm = std::string(algorithm_name(stats.algorithm));
  record.wire_bytes = stats.wire_bytes;
  record.compress_s = stats.compress_s;
  record.communicate_s = stats.communicate_s;
  record.decompress_s = stats.decompress_s;
  if (timeline_) {
    // The collective reports per-phase durations; they are laid end to end inside the call.
    auto at = call_start;
    auto span = [&](const char* phase, double seconds) {
      auto end = at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
      timeline_->event(phase, "allreduce", 1, at, std::min(end, call_end),
                       fmt::format("{{\"buffer\":{},\"spec\":{},\"algorithm\":{},\"tensors\":{},\"bytes\":{},"
                                   "\"wire_bytes\":{}}}",
                                   json_string(buffer_name), json_string(record.spec), json_string(record.algorithm),
                                   record.tensors, record.input_bytes, record.wire_bytes));
      at = std::min(end, call_end);
    };
    span("compress", stats.compress_s);
    span("communicate", stats.communicate_s);
    span("decompress", stats.decompress_s);
  }

  // Error feedback: r(name) = v - transmitted.
  if (codec.runtime_ef) {
    auto ef_start = Clock::now();
    scratch_.resize(group.numel);
    TensorView sent = TensorView::of(std::span<float>(scratch_));
    if (capturing.complete()) {
      for (const Captured& captured : capturing.captures()) {
        const TensorView part = sent.slice(captured.offset, captured.numel);
        codec.compressor->decompress(captured.payload, part, DecodeMode::kOverwrite);
        if (captured.prescale != 1.0f && captured.prescale != 0.0f) {
          float* values = part.data_as<float>();
          const float unscale = 1.0f / captured.prescale;
          for (std::size_t i = 0; i < captured.numel; ++i) values[i] *= unscale;
        }
      }
    } else {
      // The algorithm compressed other memory: recompute this rank's payload of v (same name and step, same bits).
      std::lock_guard lock(residual_mutex_);
      for (std::size_t m = 0; m < members.size(); ++m) {
        const auto& r = residuals_.at(members[m]->name);
        std::copy(r.begin(), r.end(), scratch_.begin() + static_cast<std::ptrdiff_t>(group.offsets[m]));
      }
      payload_scratch_.resize(codec.compressor->max_payload_bytes(group.numel));
      CompressContext ctx;
      ctx.name = buffer_name;
      ctx.step = options.step;
      ctx.rank = comm_.rank();
      ctx.world_size = comm_.size();
      const std::size_t size = codec.compressor->compress(sent, payload_scratch_, ctx);
      codec.compressor->decompress(std::span<const std::byte>(payload_scratch_.data(), size), sent,
                                   DecodeMode::kOverwrite);
    }
    std::lock_guard lock(residual_mutex_);
    for (std::size_t m = 0; m < members.size(); ++m) {
      auto& r = residuals_.at(members[m]->name);
      const float* t = scratch_.data() + group.offsets[m];
      for (std::size_t i = 0; i < r.size(); ++i) r[i] -= t[i];
    }
    const double ef_s = seconds_since(ef_start);
    record.compress_s += ef_s;
    if (timeline_) timeline_->event("error_feedback", "fusion", 1, ef_start, Clock::now());
  }

  // Scatter back.
  if (!single) {
    auto out_start = Clock::now();
    for (std::size_t m = 0; m < members.size(); ++m) {
      std::memcpy(tensors[m].data(), static_cast<const std::byte*>(buffer.data()) + group.offsets[m] * elem,
                  tensors[m].bytes());
    }
    auto out_end = Clock::now();
    record.copy_out_s = std::chrono::duration<double>(out_end - out_start).count();
    if (timeline_) timeline_->event("copy_out", "fusion", 1, out_start, out_end);
  }
  return record;
}

}  // namespace gradcomp::runtime
