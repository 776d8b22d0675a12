// The communicators' environment settings and the elapsed time their error messages report.
#pragma once

#include <chrono>
#include <optional>

namespace gradcomp::comm {

// GRADCOMP_LOCAL_SIZE as a positive integer, or nullopt when unset. Throws InvalidArgument when set but invalid.
std::optional<int> local_size_from_env();

// Milliseconds elapsed since `start`, for messages.
long long ms_since(std::chrono::steady_clock::time_point start);

}  // namespace gradcomp::comm
