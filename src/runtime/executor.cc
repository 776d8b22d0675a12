#include "src/runtime/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/memory_space.h"
#include "compressors/framework/error_feedback.h"
#include "compressors/framework/gather_codec.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "src/runtime/locked_compressor.h"
#include "src/runtime/policy.h"

namespace gradcomp::runtime {
namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
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

Codec& Executor::codec_for(const std::string& spec) {
  auto it = codecs_.find(spec);
  if (it != codecs_.end()) return it->second;
  Codec codec;
  codec.spec = spec;
  codec.compressor = make_compressor(spec);
  codec.traits = codec.compressor->traits();
  return codecs_.emplace(spec, std::move(codec)).first->second;
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
      auto compressor = make_compressor(specs[c]);
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
  std::lock_guard lock(codecs_mutex_);
  for (const auto& [spec, codec] : codecs_) {
    std::lock_guard codec_lock(*codec.mutex);  // a lane may be encoding with it
    const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(codec.compressor.get());
    const TensorState* state = ef ? ef->state_of(name) : nullptr;
    if (state != nullptr && !state->buffers.empty() && !state->buffers[0].empty()) return state->buffers[0];
  }
  return {};
}

namespace {
constexpr std::uint32_t kCodecMagic = 0x32455845;  // "EXE2": codecs keep the residuals (was "EXEC")
}  // namespace

void Executor::save_state(ByteWriter& writer) const {
  std::lock_guard lock(codecs_mutex_);
  writer.put<std::uint32_t>(kCodecMagic);
  writer.put<std::uint64_t>(codecs_.size());
  for (const auto& [spec, codec] : codecs_) {
    writer.put_string(codec.spec);
    const std::vector<std::byte> state = codec.compressor->save_state();
    writer.put_array(std::span<const std::byte>(state));
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
  std::map<std::string, ResidualShape> shapes;
  const auto codec_count = reader.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < codec_count; ++i) {
    Codec codec;
    codec.spec = reader.get_string();
    const auto state = reader.get_array<std::byte>();
    codec.compressor = make_compressor(codec.spec);
    codec.compressor->load_state(state);
    codec.traits = codec.compressor->traits();
    if (const auto* ef = dynamic_cast<const ErrorFeedbackCompressor*>(codec.compressor.get())) {
      for (const auto& [name, numel] : ef->state_sizes()) shapes[name] = ResidualShape{numel, codec.spec};
    }
    GRADCOMP_CHECK_AS(CorruptPayload, codecs.count(codec.spec) == 0,
                      "corrupt runtime state on rank {}: codec '{}' twice", comm_.rank(), codec.spec);
    codecs.emplace(codec.spec, std::move(codec));
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
  {
    std::lock_guard lock(codecs_mutex_);
    codecs_ = std::move(codecs);
  }
  steps_ = std::move(steps);
  model_ = std::move(model);
  return shapes;
}

Executor::Prepared Executor::prepare(const FusionGroup& group, std::vector<Member> members) {
  Prepared prepared;
  prepared.group = group;
  prepared.members = std::move(members);
  BufferRecord& record = prepared.record;
  record.tensors = prepared.members.size();
  record.input_bytes = group.bytes;
  record.op = group.op;
  std::lock_guard lock(codecs_mutex_);
  Compressor* owned = prepared.members[0].compressor;
  if (owned == nullptr) {
    std::string spec = group.spec;
    if (spec == kAutoSpec) {
      spec = group.dtype == DType::kF32 ? choose_auto(group.bytes, record) : canonical_spec("none");
    }
    Codec& codec = codec_for(spec);
    prepared.compressor = codec.compressor.get();
    prepared.codec_mutex = codec.mutex.get();
  } else {
    auto& mutex = owner_mutexes_[owned];
    if (!mutex) mutex = std::make_unique<std::mutex>();
    prepared.compressor = owned;
    prepared.codec_mutex = mutex.get();
  }
  record.spec = prepared.compressor->spec();
  for (Member& member : prepared.members) {
    if (member.step == kStepOfCall) member.step = steps_[member.name]++;
  }
  prepared.on_device = prepared.members[0].tensor.device().is_cuda();
  const auto* gather = dynamic_cast<const GatherCodec*>(prepared.compressor);
  prepared.gather = options_.fusion_gather && !prepared.on_device && prepared.members.size() > 1 &&
                    gather != nullptr && gather->gathers() &&
                    resolve_algorithm(prepared.compressor->traits(), options_.algorithm) == AllreduceAlgorithm::kDense;
  return prepared;
}

BufferRecord Executor::execute(const FusionGroup& group, std::vector<Member> members) {
  Prepared prepared = prepare(group, std::move(members));
  return run(prepared, comm_, fusion_pool_, -1);
}

BufferRecord Executor::run(Prepared& prepared, Communicator& data, algorithms::BlockPool& pool, int lane) {
  BufferRecord record = prepared.record;
  record.lane = lane;
  const int row = lane < 0 ? 1 : 3 + lane;  // timeline row: the cycle thread's, or the lane's
  LockedCompressor compressor(*prepared.compressor, *prepared.codec_mutex);
  Packed packed = pack(prepared, pool, record, row);
  Communicator& data_comm = prepared.on_device && options_.device_comm != nullptr ? *options_.device_comm : data;
  reduce(packed, prepared, data_comm, compressor, record, row);
  if (prepared.members.size() > 1 && !prepared.gather) unpack(packed, prepared, record, row);
  return record;
}

Executor::Packed Executor::pack(const Prepared& prepared, algorithms::BlockPool& pool, BufferRecord& record,
                                int row) {
  const FusionGroup& group = prepared.group;
  const std::vector<Member>& members = prepared.members;
  const bool single = members.size() == 1;
  const bool copied = !single && !prepared.gather;  // members laid out in a fusion buffer
  // The runtime's own codecs key state by the negotiated name (scope included); an owner's compressor by the names
  // the owner submitted, as it would outside the runtime.
  auto state_name = [](const Member& member) -> std::string_view {
    return member.compressor != nullptr ? std::string_view(member.user_name) : std::string_view(member.name);
  };
  Packed packed;
  packed.name = single ? std::string(state_name(members[0]))
                       : fmt::format("fused[{}+{}]#{}", members[0].name, members.size() - 1, group.numel);
  const std::size_t elem = dtype_size(group.dtype);

  // Every member is a segment that keeps its own error-feedback state and step, so the codec compresses it as it
  // would alone. A group of one runs in the caller's memory (no copy). CUDA tensors are fused in device memory on
  // the first member's stream (members on other streams are waited for first).
  auto copy_start = Clock::now();
  const TensorView& first = members[0].tensor;
  if (prepared.on_device) packed.device_space = algorithms::cuda_space(first);
  packed.space = prepared.on_device ? packed.device_space.get() : &algorithms::host_space();
  // The fusion buffer comes from a pool (buffer_pool.h), so a repeated layout reuses the same block: on the host the
  // caller's (the algorithms' per-thread pool then keeps its slots for payloads), on a device the space's.
  packed.buffer = first;
  record.gathered = prepared.gather;
  if (prepared.gather) {
    packed.buffer = TensorView();
    packed.parts.reserve(members.size());
    for (const Member& member : members) packed.parts.push_back(member.tensor);
  } else if (!single) {
    packed.storage = prepared.on_device ? packed.space->allocate(group.bytes) : algorithms::Bytes(pool, group.bytes);
    packed.buffer = packed.space->view(packed.storage.data(), group.numel, group.dtype);
  }
  packed.segments.reserve(members.size());
  for (std::size_t m = 0; m < members.size(); ++m) {
    const TensorView& t = members[m].tensor;
    if (copied) {
      if (prepared.on_device && t.stream() != first.stream()) algorithms::cuda_space(t)->synchronize();
      packed.space->copy(static_cast<std::byte*>(packed.buffer.data()) + group.offsets[m] * elem, t.data(),
                         t.bytes());
    }
    packed.segments.push_back(
        TensorSegment{state_name(members[m]), group.offsets[m], t.numel(), members[m].start,
                      members[m].total == 0 ? t.numel() : members[m].total, t.rows(), members[m].step});
  }
  if (copied) record.copy_bytes += group.bytes;
  auto copy_end = Clock::now();
  record.copy_in_s = std::chrono::duration<double>(copy_end - copy_start).count();
  if (timeline_ && timeline_->active() && copied) timeline_->event("copy_in", "fusion", row, copy_start, copy_end);
  return packed;
}

void Executor::reduce(Packed& packed, const Prepared& prepared, Communicator& data, Compressor& compressor,
                      BufferRecord& record, int row) {
  AllreduceOptions options;
  options.op = prepared.group.op;  // one op per buffer: plan_fusion never mixes ops
  options.verify = false;          // names, sizes and specs were negotiated
  options.algorithm = options_.algorithm;
  options.step = packed.segments[0].step;
  options.segments = packed.segments;
  const auto call_start = Clock::now();
  AllreduceStats stats = packed.parts.empty()
                             ? compressed_allreduce(data, compressor, packed.buffer, packed.name, options)
                             : algorithms::dense_allreduce_parts(data, compressor, packed.parts, packed.name, options);
  const auto call_end = Clock::now();
  record.staged_bytes = stats.staged_bytes;
  record.allocations = stats.allocations;
  record.algorithm = std::string(algorithm_name(stats.algorithm));
  record.wire_bytes = stats.wire_bytes;
  record.compress_s = stats.compress_s;
  record.communicate_s = stats.communicate_s;
  record.decompress_s = stats.decompress_s;
  if (!timeline_ || !timeline_->active()) return;
  // The collective reports per-phase durations; they are laid end to end inside the call.
  auto at = call_start;
  auto span = [&](const char* phase, double seconds) {
    auto end = at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    timeline_->event(phase, "allreduce", row, at, std::min(end, call_end),
                     fmt::format("{{\"buffer\":{},\"spec\":{},\"algorithm\":{},\"tensors\":{},\"bytes\":{},"
                                 "\"wire_bytes\":{},\"lane\":{}}}",
                                 json_string(packed.name), json_string(record.spec), json_string(record.algorithm),
                                 record.tensors, record.input_bytes, record.wire_bytes, record.lane));
    at = std::min(end, call_end);
  };
  span("compress", stats.compress_s);
  span("communicate", stats.communicate_s);
  span("decompress", stats.decompress_s);
}

void Executor::unpack(const Packed& packed, const Prepared& prepared, BufferRecord& record, int row) {
  const FusionGroup& group = prepared.group;
  const std::size_t elem = dtype_size(group.dtype);
  auto out_start = Clock::now();
  for (std::size_t m = 0; m < prepared.members.size(); ++m) {
    const TensorView& t = prepared.members[m].tensor;
    packed.space->copy(t.data(), static_cast<const std::byte*>(packed.buffer.data()) + group.offsets[m] * elem,
                       t.bytes());
  }
  packed.space->synchronize();  // the members are complete when their handles are
  record.copy_bytes += group.bytes;
  auto out_end = Clock::now();
  record.copy_out_s = std::chrono::duration<double>(out_end - out_start).count();
  if (timeline_ && timeline_->active()) timeline_->event("copy_out", "fusion", row, out_start, out_end);
}

}  // namespace gradcomp::runtime
