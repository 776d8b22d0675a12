// What compressed_allreduce's agreement check (AllreduceOptions::verify) compares across ranks; the check itself is
// gradcomp::check_agreement (collectives.h, verify.cc), the one every entry uses.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/tensor.h"

namespace gradcomp::algorithms {

// What compressed_allreduce's check compares: the name, numel, dtype, spec, algorithm, op, hierarchical, and every
// segment's name and numel (with rows for shape-aware codecs, which size their rounds by them).
std::string describe_allreduce(const Compressor& compressor, const TensorView& tensor, std::string_view name,
                               const AllreduceOptions& options);

}  // namespace gradcomp::algorithms
