// Minimal argument scanning for the gradcomp command-line tool.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gradcomp::cli {

class Args {
 public:
  Args(std::vector<std::string> args) : args_(std::move(args)) {}

  // Removes and returns true if `flag` is present.
  bool flag(std::string_view flag);
  // Removes `--name VALUE` or `--name=VALUE`; returns `fallback` when absent. Throws InvalidArgument if the value
  // is missing.
  std::string option(std::string_view name, std::string fallback);
  long long option_int(std::string_view name, long long fallback);
  // Remaining positional arguments; throws InvalidArgument if an unknown --option is left.
  std::vector<std::string> positionals(std::string_view command) const;

 private:
  std::vector<std::string> args_;
};

}  // namespace gradcomp::cli
