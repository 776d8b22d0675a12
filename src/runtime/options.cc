// RuntimeOptions' defaults from the environment, and the small value types of gradcomp/runtime.h.
#include <cstdint>
#include <limits>

#include "gradcomp/runtime.h"
#include "src/core/env.h"

namespace gradcomp {

namespace {
constexpr long long kMaxBytes = std::numeric_limits<long long>::max();
}  // namespace

std::size_t default_fusion_threshold() {
  return static_cast<std::size_t>(
      env::integer("GRADCOMP_FUSION_THRESHOLD", 0, kMaxBytes, "bytes").value_or(std::int64_t{64} << 20));
}

std::size_t default_fusion_tensor_limit() {
  return static_cast<std::size_t>(
      env::integer("GRADCOMP_FUSION_TENSOR_LIMIT", 0, kMaxBytes, "bytes").value_or(std::int64_t{1} << 20));
}

std::string default_timeline_path() { return env::text("GRADCOMP_TIMELINE").value_or(""); }

double default_cycle_time_ms() { return env::number("GRADCOMP_CYCLE_TIME_MS", 0, 1e9, "milliseconds").value_or(1.0); }

double default_idle_cycle_max_ms() {
  return env::number("GRADCOMP_IDLE_CYCLE_MAX_MS", 0, 1e9, "milliseconds").value_or(50.0);
}

int default_pipeline_lanes() {
  return static_cast<int>(env::integer("GRADCOMP_PIPELINE_LANES", 0, 16, "lanes").value_or(2));
}

std::size_t default_partition_bytes() {
  return static_cast<std::size_t>(
      env::integer("GRADCOMP_PARTITION_BYTES", 0, kMaxBytes, "bytes").value_or(std::int64_t{16} << 20));
}

bool default_fusion_gather() { return env::integer("GRADCOMP_FUSION_GATHER", 0, 1, "0 or 1").value_or(1) != 0; }

std::string Status::message() const {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

void Status::rethrow() const {
  if (error) std::rethrow_exception(error);
}

double RuntimeStats::compression_ratio() const {
  return wire_bytes == 0 ? 0.0 : static_cast<double>(input_bytes) / static_cast<double>(wire_bytes);
}

}  // namespace gradcomp
