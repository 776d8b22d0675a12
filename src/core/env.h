// Typed readers of GRADCOMP_* environment variables, the one place they are parsed. Unset or empty: std::nullopt.
// A malformed or out-of-range value throws InvalidArgument naming the variable, the value and what was expected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gradcomp::env {

std::optional<std::string> text(const char* name);
// A finite number in [min, max]; `what` describes the unit for the error message ("seconds", "milliseconds").
std::optional<double> number(const char* name, double min, double max, const char* what);
// An integer in [min, max] (decimal digits only).
std::optional<long long> integer(const char* name, long long min, long long max, const char* what);

}  // namespace gradcomp::env
