#include "comm/comm_env.h"

#include "src/core/env.h"

namespace gradcomp::comm {

std::optional<int> local_size_from_env() {
  const auto ranks = env::integer("GRADCOMP_LOCAL_SIZE", 1, (1 << 20) - 1, "ranks per emulated node");
  if (!ranks) return std::nullopt;
  return static_cast<int>(*ranks);
}

long long ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace gradcomp::comm
