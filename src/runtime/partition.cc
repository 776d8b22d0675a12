#include "src/runtime/partition.h"

#include "compressors/framework/error_feedback.h"
#include "gradcomp/error.h"

namespace gradcomp::runtime {

std::size_t partition_count(const Executor::Prepared& prepared, std::size_t part_bytes, AllreduceAlgorithm algorithm) {
  if (part_bytes == 0 || prepared.members.size() != 1 || prepared.on_device) return 1;
  const Executor::Member& member = prepared.members[0];
  if (member.total != 0) return 1;  // already a part
  const auto* codec = dynamic_cast<const ErrorFeedbackCompressor*>(prepared.compressor);
  if (codec == nullptr || !codec->gathers() || codec->nonfinite_policy() == NonFinitePolicy::kSkip) return 1;
  if (resolve_algorithm(codec->traits(), algorithm) != AllreduceAlgorithm::kDense) return 1;
  const std::size_t bytes = member.tensor.bytes();
  if (bytes / 2 < part_bytes) return 1;
  return std::min((bytes + part_bytes - 1) / part_bytes, member.tensor.numel());
}

Executor::Prepared partition_part(const Executor::Prepared& prepared, std::size_t index, std::size_t count) {
  GRADCOMP_ASSERT(prepared.members.size() == 1 && index < count, "partition_part: part {} of {} of a {}-member group",
                  index, count, prepared.members.size());
  const Executor::Member& whole = prepared.members[0];
  const std::size_t numel = whole.tensor.numel();
  const std::size_t begin = numel * index / count;
  const std::size_t end = numel * (index + 1) / count;
  Executor::Prepared part;
  part.group = prepared.group;
  part.group.numel = end - begin;
  part.group.bytes = (end - begin) * dtype_size(whole.tensor.dtype());
  part.group.offsets = {0};
  Executor::Member member = whole;
  member.tensor = whole.tensor.slice(begin, end - begin);
  member.start = begin;
  member.total = numel;
  part.members = {std::move(member)};
  part.compressor = prepared.compressor;
  part.codec_mutex = prepared.codec_mutex;
  part.on_device = prepared.on_device;
  part.gather = prepared.gather;
  part.record = prepared.record;
  part.record.input_bytes = part.group.bytes;
  return part;
}

}  // namespace gradcomp::runtime
