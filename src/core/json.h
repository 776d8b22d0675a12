// JSON text helpers shared by the CLI, the timeline and the benchmarks' --json output.
#pragma once

#include <string>
#include <string_view>

namespace gradcomp {

// `text` as a JSON string literal, quotes included; control characters escaped.
std::string json_string(std::string_view text);

}  // namespace gradcomp
