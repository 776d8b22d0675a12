// Random-k's positions on the device (CUDA builds only): the k ascending indices that compressors/codecs/randomk.cc's
// randomk_indices() draws on the host with Floyd's algorithm, decided in parallel by kernels/randomk_ops.cuh (the
// draws, a CUB radix sort of them by value, one decision per candidate, a CUB stable selection). The same bits on
// both, so ranks agree without sending indices and the device never waits for the host. Two-phase workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradcomp::kernels {

// Device workspace the positions of k of n need.
std::size_t randomk_workspace_bytes(std::uint64_t n, std::uint64_t k);

// Writes the k ascending indices random-k picks for (seed, tensor_key, step) in a tensor of n elements (k <= n <
// 2^31) into `indices` (k int32, device), enqueued on `stream`; `workspace` holds randomk_workspace_bytes(n, k).
void launch_randomk_indices(std::uint64_t seed, std::uint64_t tensor_key, std::uint64_t step, std::uint64_t n,
                            std::uint64_t k, std::int32_t* indices, void* workspace, cudaStream_t stream);

}  // namespace gradcomp::kernels
