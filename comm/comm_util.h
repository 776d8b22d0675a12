// Helpers shared by the Communicator backends and their callers: element-wise reductions on host memory, validation
// of reduce requests, environment settings, gathering blobs of different sizes.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "gradcomp/communicator.h"
#include "gradcomp/tensor.h"

namespace gradcomp::comm {

// Throws InvalidArgument unless `op` is defined for `dtype` (see ReduceOp) — naming the backend and rank.
void check_reduce(DType dtype, ReduceOp op, std::string_view backend, int rank);

// acc[i] = acc[i] (op) in[i] for `n` elements of `dtype` (kAverage accumulates like kSum). f16/bf16 are added in
// f32 and rounded once per call (round to nearest even).
void reduce_into(void* acc, const void* in, std::size_t n, DType dtype, ReduceOp op);

// data[i] /= divisor for floating types (the last step of kAverage).
void divide_by(void* data, std::size_t n, DType dtype, int divisor);

// GRADCOMP_LOCAL_SIZE as a positive integer, or nullopt when unset. Throws InvalidArgument when set but invalid.
std::optional<int> local_size_from_env();

// Every rank's `mine` (host memory, any size per rank), in rank order: one allgather of the sizes, one allgatherv.
// Collective. For the payloads of the collectives, which may live on a device, see algorithms::allgather_payloads.
std::vector<std::vector<std::byte>> allgather_blobs(Communicator& comm, std::span<const std::byte> mine);

// Milliseconds elapsed since `start`, for messages.
long long ms_since(std::chrono::steady_clock::time_point start);

}  // namespace gradcomp::comm
