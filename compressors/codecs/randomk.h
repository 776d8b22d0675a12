// `randomk`: random-k sparsification with error feedback (Stich et al. 2018). Sends the values of k = max(1,
// round(ratio*n)) distinct, uniformly chosen positions of v = residual + grad; the positions are never sent: every
// rank regenerates them from (seed, tensor key, step) with Philox (Floyd's sampling), and the payload carries those
// three numbers so the decoder can too. Values are not rescaled (error feedback keeps the rest). Gatherable, lossy.
#pragma once

#include <cstdint>
#include <vector>

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo randomk_compressor_info();

// The k distinct indices (ascending) random-k sends for a tensor of n elements at (seed, tensor_key, step):
// Floyd's algorithm over the Philox stream keyed by (seed, tensor_key ^ salt, step). k must be <= n. A pure function:
// every rank, thread count and run gets the same indices.
void randomk_indices(std::uint64_t seed, std::uint64_t tensor_key, std::uint64_t step, std::uint64_t n,
                     std::uint64_t k, std::vector<std::uint32_t>& out);

}  // namespace gradcomp
