#include "allreduce_args.h"

#include <fmt/format.h>

#include <nanobind/stl/string.h>

#include "gradcomp/error.h"

namespace gradcomp::python {

ReduceOp op_of(std::string_view op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "average") return ReduceOp::kAverage;
  throw InvalidArgument(fmt::format("unknown reduce op '{}' (valid: sum, average)", op));
}

OwnedSegments::OwnedSegments(nb::handle list, std::size_t numel, std::string_view what) {
  if (list.is_none()) return;
  const std::size_t count = nb::len(list);
  names_.reserve(count);  // no reallocation: segments_ views these strings
  std::size_t next = 0;
  for (nb::handle item : list) {
    const std::size_t fields = nb::len(item);
    GRADCOMP_CHECK(fields == 3 || fields == 4, "{}: each segment is (name, offset, numel) or (name, offset, numel, "
                   "rows), got {} fields", what, fields);
    std::string name = nb::cast<std::string>(item[0]);
    const auto offset = nb::cast<std::size_t>(item[1]);
    const auto n = nb::cast<std::size_t>(item[2]);
    GRADCOMP_CHECK(!name.empty(), "{}: segment {} has an empty name", what, names_.size());
    GRADCOMP_CHECK(offset == next, "{}: segment '{}' starts at element {}, expected {} (segments must cover the "
                   "tensor in order, without gaps or overlaps)", what, name, offset, next);
    next = offset + n;
    names_.push_back(std::move(name));
    TensorSegment segment;
    segment.name = names_.back();
    segment.offset = offset;
    segment.numel = n;
    segment.rows = fields == 4 ? nb::cast<std::size_t>(item[3]) : 0;
    GRADCOMP_CHECK(segment.rows == 0 || n % segment.rows == 0,
                   "{}: segment '{}' has {} elements, not a multiple of its {} rows", what, names_.back(), n,
                   segment.rows);
    segments_.push_back(segment);
  }
  GRADCOMP_CHECK(count == 0 || next == numel, "{}: the segments cover {} elements but the tensor has {}", what, next,
                 numel);
}

void fill_stats(nb::dict out, const AllreduceStats& stats) {
  out["algorithm"] = std::string(algorithm_name(stats.algorithm));
  out["input_bytes"] = stats.input_bytes;
  out["payload_bytes"] = stats.payload_bytes;
  out["wire_bytes"] = stats.wire_bytes;
  out["switched_to_dense"] = stats.switched_to_dense;
  out["union_nnz"] = stats.union_nnz;
  out["hierarchical"] = stats.hierarchical;
  out["staged_bytes"] = stats.staged_bytes;
  out["allocations"] = stats.allocations;
  out["synchronizations"] = stats.synchronizations;
  out["compress_s"] = stats.compress_s;
  out["communicate_s"] = stats.communicate_s;
  out["decompress_s"] = stats.decompress_s;
}

}  // namespace gradcomp::python
