// Subcommands of the gradcomp command-line tool. Each returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace gradcomp::cli {

int run_list(std::vector<std::string> args);
int run_probe(std::vector<std::string> args);

// JSON string literal of `text` (quotes included).
std::string json_string(const std::string& text);

}  // namespace gradcomp::cli
