// ErrorFeedbackCompressor's per-tensor state as calls lay it out (compressors/error_feedback.h): the size check, the
// gather/scatter of a call made of segments, and the resident block a repeated fused layout keeps between calls.
#include "compressors/error_feedback.h"

#include "compressors/segments.h"
#include "gradcomp/error.h"

namespace gradcomp {

TensorState& ErrorFeedbackCompressor::resident_work(std::span<const TensorSegment> segments,
                                                    const std::vector<TensorState*>& states, std::string_view call) {
  auto it = resident_.find(call);
  bool same = it != resident_.end() && it->second.layout.size() == segments.size();
  for (std::size_t s = 0; same && s < segments.size(); ++s) {
    const auto owner = resident_in_.find(segments[s].name);
    same = it->second.layout[s].first == segments[s].name && it->second.layout[s].second == segments[s].numel &&
           owner != resident_in_.end() && owner->second == call;
  }
  if (same) return it->second.work;
  // A new or changed layout: every tensor of the call back in its own state, then one gather into a new block.
  if (it != resident_.end()) materialize(it->second.layout.front().first);
  for (const TensorSegment& segment : segments) materialize(segment.name);
  gather_state(segments, states, call);
  ResidentLayout block;
  for (const TensorSegment& segment : segments) block.layout.emplace_back(std::string(segment.name), segment.numel);
  block.work = std::move(work_);
  work_ = TensorState{};
  for (std::size_t s = 0; s < segments.size(); ++s) {
    for (auto& buffer : states[s]->buffers) std::vector<float>().swap(buffer);  // held by the block meanwhile
    std::vector<float>().swap(states[s]->residual_next);
    resident_in_.insert_or_assign(std::string(segments[s].name), std::string(call));
  }
  auto& slot = resident_.insert_or_assign(std::string(call), std::move(block)).first->second;
  return slot.work;
}

void ErrorFeedbackCompressor::materialize(std::string_view tensor) const {
  const auto owner = resident_in_.find(tensor);
  if (owner == resident_in_.end()) return;
  const auto it = resident_.find(owner->second);
  if (it == resident_.end()) {
    resident_in_.erase(owner);
    return;
  }
  const ResidentLayout& block = it->second;
  std::size_t offset = 0;
  for (const auto& [name, numel] : block.layout) {
    TensorState& state = states_.find(name)->second;
    state.buffers.resize(block.work.buffers.size());
    for (std::size_t b = 0; b < block.work.buffers.size(); ++b) {
      const auto& source = block.work.buffers[b];
      if (source.empty()) {
        state.buffers[b].clear();
      } else {
        state.buffers[b].assign(source.begin() + static_cast<std::ptrdiff_t>(offset),
                                source.begin() + static_cast<std::ptrdiff_t>(offset + numel));
      }
    }
    resident_in_.erase(name);
    offset += numel;
  }
  call_scalars_.insert_or_assign(it->first, block.work.scalars);
  resident_.erase(it);
}

void ErrorFeedbackCompressor::materialize_all() const {
  while (!resident_in_.empty()) materialize(resident_in_.begin()->first);
}

void ErrorFeedbackCompressor::leave_residency(std::span<const TensorSegment> segments, EncodeArgs& args) {
  // The tensors' own states again; encode_skipping gathers from them (and its scalars from call_scalars_).
  materialize(segments.front().name);
  args.state = &work_;
  args.residual = nullptr;
}

void ErrorFeedbackCompressor::check_state_size(std::string_view name, std::size_t numel, int rank) const {
  const auto it = states_.find(name);
  GRADCOMP_CHECK(it == states_.end() || it->second.numel == numel,
                 "compressor '{}': tensor '{}' on rank {} has {} elements but its saved state has {} (did its shape "
                 "change, or was state of another model loaded?)",
                 name_, name, rank, numel, it == states_.end() ? 0 : it->second.numel);
}

TensorState& ErrorFeedbackCompressor::gather_state(std::span<const TensorSegment> segments,
                                                   const std::vector<TensorState*>& states, std::string_view call) {
  const std::size_t n = segments.empty() ? 0 : segments.back().offset + segments.back().numel;
  work_.numel = n;
  work_.buffers.resize(1 + extra_state_buffers());
  std::vector<const float*> sources(segments.size());
  for (std::size_t b = 0; b < work_.buffers.size(); ++b) {
    if (b == 0 && !ef_) {
      work_.buffers[0].clear();
      continue;
    }
    work_.buffers[b].resize(n);
    for (std::size_t s = 0; s < segments.size(); ++s) sources[s] = states[s]->buffers[b].data();
    gather_segments(segments, sources, work_.buffers[b].data());
  }
  const auto scalars = call_scalars_.find(call);
  work_.scalars = scalars == call_scalars_.end() ? std::vector<double>{} : scalars->second;
  return work_;
}

void ErrorFeedbackCompressor::scatter_state(std::span<const TensorSegment> segments,
                                            const std::vector<TensorState*>& states, const std::vector<bool>& keep) {
  std::vector<float*> targets(segments.size());
  for (std::size_t b = 0; b < work_.buffers.size(); ++b) {
    if (work_.buffers[b].empty()) continue;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      targets[s] = keep[s] ? states[s]->buffers[b].data() : nullptr;
    }
    scatter_segments(segments, work_.buffers[b].data(), targets);
  }
}

}  // namespace gradcomp
