// Fusion planning and the reusable fusion buffer.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "src/runtime/negotiator.h"

namespace gradcomp::runtime {

// One fused message: indices into the ready list, in order, with their element offsets in the buffer.
struct FusionGroup {
  std::vector<std::size_t> members;
  std::vector<std::size_t> offsets;  // element offset of each member
  std::size_t numel = 0;
  std::size_t bytes = 0;
  DType dtype = DType::kF32;
  std::string spec;
  ReduceOp op = ReduceOp::kAverage;  // every member's: one buffer is reduced with one op
};

// Tensors that may share a fusion buffer: equal dtype, device, spec, reduce op and scope (one owner's compressor).
inline bool same_fusion_kind(const Signature& a, const Signature& b) {
  return a.dtype == b.dtype && a.device == b.device && a.spec == b.spec && a.op == b.op && a.scope == b.scope;
}

// Packs `ready` (in order) into groups of equal dtype, device, spec and reduce op whose bytes stay within `threshold`
// (a tensor at least as large as the threshold travels alone; threshold 0 = every tensor alone). Tensors for which
// `fusible(i)` is false also travel alone. Groups are ordered by their first member: every rank computes the same.
template <typename Fusible>
std::vector<FusionGroup> plan_fusion(const std::vector<ReadyTensor>& ready, std::size_t threshold, Fusible fusible) {
  std::vector<FusionGroup> groups;
  std::vector<std::size_t> open;  // indices of groups still accepting members
  for (std::size_t i = 0; i < ready.size(); ++i) {
    const Signature& sig = ready[i].signature;
    const std::size_t bytes = sig.numel * dtype_size(sig.dtype);
    FusionGroup* target = nullptr;
    const bool can_fuse = threshold > 0 && bytes < threshold && fusible(i);
    if (can_fuse) {
      for (std::size_t g : open) {
        FusionGroup& group = groups[g];
        if (same_fusion_kind(ready[group.members.front()].signature, sig)) {
          if (group.bytes + bytes <= threshold) target = &group;
          break;
        }
      }
    }
    if (target == nullptr) {
      if (can_fuse) {
        // The open group of this kind is full for this tensor: close it; the tensor starts the next one.
        std::erase_if(open,
                      [&](std::size_t g) { return same_fusion_kind(ready[groups[g].members.front()].signature, sig); });
      }
      groups.push_back(FusionGroup{{}, {}, 0, 0, sig.dtype, sig.spec, sig.op});
      if (can_fuse) open.push_back(groups.size() - 1);
      target = &groups.back();
    }
    target->members.push_back(i);
    target->offsets.push_back(target->numel);
    target->numel += sig.numel;
    target->bytes += bytes;
  }
  return groups;
}

}  // namespace gradcomp::runtime
