#include "src/core/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "gradcomp/error.h"

namespace gradcomp::env {

std::optional<std::string> text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<double> number(const char* name, double min, double max, const char* what) {
  const auto value = text(name);
  if (!value) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(value->c_str(), &end);
  GRADCOMP_CHECK(end == value->c_str() + value->size() && errno == 0 && std::isfinite(parsed) && parsed >= min &&
                     parsed <= max,
                 "{}='{}' is not a number of {} in [{}, {}]", name, *value, what, min, max);
  return parsed;
}

std::optional<long long> integer(const char* name, long long min, long long max, const char* what) {
  const auto value = text(name);
  if (!value) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(value->c_str(), &end, 10);
  GRADCOMP_CHECK(end == value->c_str() + value->size() && errno == 0 && parsed >= min && parsed <= max,
                 "{}='{}' is not an integer number of {} in [{}, {}]", name, *value, what, min, max);
  return parsed;
}

}  // namespace gradcomp::env
