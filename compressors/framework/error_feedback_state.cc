// ErrorFeedbackCompressor's per-tensor state on the host: lookup and creation by tensor name, the size check, and
// save/load (the envelope and records of compressors/framework/state_io.h). Device copies are pulled back first
// (sync_to_host) and dropped on load.
#include <map>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"

namespace gradcomp {

void ErrorFeedbackCompressor::reset_state() {
  drop_device_states();
  states_.clear();
}

const TensorState* ErrorFeedbackCompressor::state_of(std::string_view name) const {
  sync_to_host(name, /*drop_device=*/false);
  const auto it = states_.find(name);
  return it == states_.end() ? nullptr : &it->second;
}

std::map<std::string, std::size_t> ErrorFeedbackCompressor::state_sizes() const {
  std::map<std::string, std::size_t> sizes;
  for (const auto& [name, state] : states_) sizes.emplace(name, state.numel);
  return sizes;
}

TensorState& ErrorFeedbackCompressor::state_for(std::string_view name, std::size_t numel, int rank) {
  auto it = states_.find(name);
  if (it != states_.end()) {
    GRADCOMP_CHECK(it->second.numel == numel,
                   "compressor '{}': tensor '{}' on rank {} has {} elements but its saved state has {} (did its shape "
                   "change, or was state of another model loaded?)",
                   name_, name, rank, numel, it->second.numel);
    return it->second;
  }
  TensorState state;
  state.numel = numel;
  state.buffers.resize(1 + extra_state_buffers());
  if (ef_) state.buffers[0].assign(numel, 0.0f);
  for (std::size_t b = 1; b < state.buffers.size(); ++b) state.buffers[b].assign(numel, 0.0f);
  return states_.emplace(std::string(name), std::move(state)).first->second;
}

void ErrorFeedbackCompressor::check_state_size(std::string_view name, std::size_t numel, int rank) const {
  const auto it = states_.find(name);
  GRADCOMP_CHECK(it == states_.end() || it->second.numel == numel,
                 "compressor '{}': tensor '{}' on rank {} has {} elements but its saved state has {} (did its shape "
                 "change, or was state of another model loaded?)",
                 name_, name, rank, numel, it == states_.end() ? 0 : it->second.numel);
}

std::vector<std::byte> ErrorFeedbackCompressor::save_state() const {
  sync_to_host({}, /*drop_device=*/false);
  ByteWriter writer;
  write_state_envelope(writer, name_, states_.size());
  for (const auto& [tensor, state] : states_) {
    write_state_record(writer, tensor, state.numel, state.steps, state.buffers, state.scalars);
  }
  return writer.take();
}

void ErrorFeedbackCompressor::load_state(std::span<const std::byte> bytes) {
  ByteReader reader(bytes, fmt::format("'{}' compressor state", name_));
  const auto count = read_state_envelope(reader, name_);
  std::map<std::string, TensorState, std::less<>> loaded;
  for (std::uint64_t t = 0; t < count; ++t) {
    StateRecord record = read_state_record(reader);
    const std::string& tensor = record.name;
    TensorState state;
    state.numel = record.numel;
    state.steps = record.steps;
    const std::size_t buffers = record.buffers.size();
    GRADCOMP_CHECK(buffers == 1 + extra_state_buffers(),
                   "state of tensor '{}' has {} buffers; compressor '{}' keeps {}", tensor, buffers, name_,
                   1 + extra_state_buffers());
    state.buffers = std::move(record.buffers);
    for (std::size_t b = 0; b < buffers; ++b) {
      const std::size_t expected = (b == 0 && !ef_) ? 0 : state.numel;
      if (b == 0 && ef_ && state.buffers[0].empty()) state.buffers[0].assign(state.numel, 0.0f);  // saved with ef=off
      if (b == 0 && !ef_) state.buffers[0].clear();  // ef=off now: the residual is dropped
      GRADCOMP_CHECK(state.buffers[b].size() == (b == 0 && !ef_ ? 0 : state.numel),
                     "state of tensor '{}' buffer {} has {} values, expected {}", tensor, b, state.buffers[b].size(),
                     expected);
    }
    state.scalars = std::move(record.scalars);
    loaded.emplace(std::move(record.name), std::move(state));
  }
  GRADCOMP_CHECK_AS(CorruptPayload, reader.at_end(), "corrupt compressor state: {} trailing bytes", reader.remaining());
  drop_device_states();
  states_ = std::move(loaded);
}

}  // namespace gradcomp
