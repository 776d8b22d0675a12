// Compressed collectives: one entry point that picks the algorithm from the compressor's traits.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/tensor.h"

namespace gradcomp {

enum class AllreduceAlgorithm { kAuto, kDense, kAllgather, kSparseAllreduce, kScatterReduceAllgather };

// "auto", "dense", "allgather", "sparse", "sra".
std::string_view algorithm_name(AllreduceAlgorithm algorithm);

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kAverage;
  // kAuto picks from the traits: summable -> dense, gatherable -> sparse allreduce (switching to dense past the
  // break-even density), requantizable -> scatter-reduce-allgather.
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::uint64_t step = 0;
};

// What one compressed allreduce did.
struct AllreduceStats {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::size_t input_bytes = 0;   // uncompressed bytes of the tensor
  std::size_t wire_bytes = 0;    // bytes this rank sent
  bool switched_to_dense = false;
  double compress_s = 0, communicate_s = 0, decompress_s = 0;
};

// In place: `tensor` on every rank becomes the average (or sum) over ranks of what each rank's compressor
// transmitted for `name`. Every rank must call it with the same name, numel, dtype and compressor spec; a mismatch
// throws InvalidArgument on every rank.
AllreduceStats compressed_allreduce(Communicator& comm, Compressor& compressor, const TensorView& tensor,
                                    std::string_view name, const AllreduceOptions& options = {});

}  // namespace gradcomp
