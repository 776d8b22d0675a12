// Subcommands of the gradcomp command-line tool. Each returns the process exit code.
#pragma once

#include "src/core/json.h"

#include <string>
#include <vector>

namespace gradcomp::cli {

int run_list(std::vector<std::string> args);
int run_probe(std::vector<std::string> args);

using gradcomp::json_string;  // src/core/json.h

}  // namespace gradcomp::cli
