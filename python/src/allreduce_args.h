// Arguments and results of compressed_allreduce as they cross from Python: the reduce op, the segment list of a
// fused tensor (a DDP bucket) and the AllreduceStats dict. Shared by the direct binding and the exchange worker.
#pragma once

#include <nanobind/nanobind.h>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"

namespace gradcomp::python {

namespace nb = nanobind;

// "sum" or "average"; anything else throws InvalidArgument listing both.
ReduceOp op_of(std::string_view op);

// TensorSegments that own their names (AllreduceOptions::segments holds string_views into `names`). Not copyable:
// the views point into this object's strings.
class OwnedSegments {
 public:
  // From a Python sequence of (name, offset, numel) or (name, offset, numel, rows) tuples covering a tensor of `numel` elements in order. Throws
  // InvalidArgument (naming `what`) for an empty name, a gap, an overlap or a list that does not cover the tensor.
  OwnedSegments(nb::handle list, std::size_t numel, std::string_view what);
  OwnedSegments(const OwnedSegments&) = delete;
  OwnedSegments& operator=(const OwnedSegments&) = delete;

  std::span<const TensorSegment> view() const { return segments_; }

 private:
  std::vector<std::string> names_;
  std::vector<TensorSegment> segments_;
};

// {"algorithm", "input_bytes", "payload_bytes", "wire_bytes", "switched_to_dense", "union_nnz", "hierarchical",
// "staged_bytes", "allocations", "synchronizations", "compress_s", "communicate_s", "decompress_s"} written into
// `out`. Needs the GIL.
void fill_stats(nb::dict out, const AllreduceStats& stats);

}  // namespace gradcomp::python
