// gradcomp list: the registered compressors.
#include <fmt/format.h>

#include "gradcomp/registry.h"
#include "src/cli/args.h"
#include "src/cli/commands.h"

namespace gradcomp::cli {


namespace {

constexpr const char* kListHelp = R"(usage: gradcomp list [--json]

Prints every registered compressor: its spec name, what it does, its traits (which collective it rides) and each
parameter with its type, range and default. With --json, one JSON array of objects.
)";

std::string kind_name(ParamSpec::Kind kind) {
  switch (kind) {
    case ParamSpec::Kind::kInt: return "int";
    case ParamSpec::Kind::kFloat: return "float";
    case ParamSpec::Kind::kBool: return "bool";
    case ParamSpec::Kind::kChoice: return "choice";
  }
  return "?";
}

}  // namespace

int run_list(std::vector<std::string> raw) {
  Args args(std::move(raw));
  if (args.flag("--help") || args.flag("-h")) {
    fmt::print("{}", kListHelp);
    return 0;
  }
  const bool json = args.flag("--json");
  args.positionals("list");
  const auto infos = default_registry().list();
  if (json) {
    fmt::print("[");
    for (std::size_t i = 0; i < infos.size(); ++i) {
      const auto& info = infos[i];
      fmt::print("{}{{\"name\": {}, \"summary\": {}, \"traits\": {{\"summable\": {}, \"gatherable\": {}, "
                 "\"requantizable\": {}, \"rounds\": {}, \"lossy\": {}}}, \"params\": [",
                 i ? ", " : "", json_string(info.name), json_string(info.summary), info.traits.summable,
                 info.traits.gatherable, info.traits.requantizable, info.traits.rounds, info.traits.lossy);
      for (std::size_t p = 0; p < info.params.size(); ++p) {
        const auto& param = info.params[p];
        fmt::print("{}{{\"name\": {}, \"kind\": {}, \"type\": {}, \"default\": {}, \"help\": {}}}", p ? ", " : "",
                   json_string(param.name), json_string(kind_name(param.kind)),
                   json_string(describe_param_type(param)),
                   param.default_value.empty() ? std::string("null") : json_string(param.default_value),
                   json_string(param.help));
      }
      fmt::print("]}}");
    }
    fmt::print("]\n");
    return 0;
  }
  for (const auto& info : infos) {
    fmt::print("{:<10} {}\n", info.name, info.summary);
    fmt::print("{:<10} traits: {}\n", "", describe_traits(info.traits));
    for (const auto& param : info.params) {
      fmt::print("{:<10}   {:<10} {:<18} default {:<8} {}\n", "", param.name, describe_param_type(param),
                 param.default_value.empty() ? "-" : param.default_value, param.help);
    }
  }
  return 0;
}

}  // namespace gradcomp::cli
