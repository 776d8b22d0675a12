#include "src/cli/args.h"

#include <cstdlib>

#include "gradcomp/error.h"

namespace gradcomp::cli {

bool Args::flag(std::string_view flag) {
  for (auto it = args_.begin(); it != args_.end(); ++it) {
    if (*it == flag) {
      args_.erase(it);
      return true;
    }
  }
  return false;
}

std::string Args::option(std::string_view name, std::string fallback) {
  const std::string prefix = std::string(name) + "=";
  for (auto it = args_.begin(); it != args_.end(); ++it) {
    if (*it == name) {
      GRADCOMP_CHECK(it + 1 != args_.end(), "option {} needs a value", name);
      std::string value = *(it + 1);
      args_.erase(it, it + 2);
      return value;
    }
    if (it->rfind(prefix, 0) == 0) {
      std::string value = it->substr(prefix.size());
      args_.erase(it);
      return value;
    }
  }
  return fallback;
}

long long Args::option_int(std::string_view name, long long fallback) {
  const std::string text = option(name, "");
  if (text.empty()) return fallback;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);  // accepts 1e6
  GRADCOMP_CHECK(end == text.c_str() + text.size() && value >= 0 && value == static_cast<long long>(value),
                 "option {} needs a non-negative integer, got '{}'", name, text);
  return static_cast<long long>(value);
}

std::vector<std::string> Args::positionals(std::string_view command) const {
  for (const auto& arg : args_) {
    GRADCOMP_CHECK(arg.size() < 2 || arg.rfind("--", 0) != 0, "unknown option '{}' for '{}' (see gradcomp {} --help)",
                   arg, command, command);
  }
  return args_;
}

}  // namespace gradcomp::cli
