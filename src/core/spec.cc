// Spec strings ("topk:ratio=0.01,ef=on") and validated parameter values.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool is_identifier(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string format_number(double value) { return fmt::format("{}", value); }

}  // namespace

ParsedSpec parse_spec(std::string_view spec) {
  const std::string original(spec);
  spec = trim(spec);
  GRADCOMP_CHECK(!spec.empty(), "empty compressor spec (expected e.g. \"topk:ratio=0.01\")");
  ParsedSpec parsed;
  const auto colon = spec.find(':');
  parsed.name = std::string(trim(spec.substr(0, colon)));
  GRADCOMP_CHECK(is_identifier(parsed.name),
                 "bad compressor spec \"{}\": name \"{}\" must be lower-case letters, digits or '_'", original,
                 parsed.name);
  if (colon == std::string_view::npos) return parsed;
  std::string_view rest = spec.substr(colon + 1);
  GRADCOMP_CHECK(!trim(rest).empty(), "bad compressor spec \"{}\": nothing after ':' (expected key=value pairs)",
                 original);
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const auto equals = item.find('=');
    GRADCOMP_CHECK(equals != std::string_view::npos, "bad compressor spec \"{}\": \"{}\" is not key=value", original,
                   item);
    const std::string key(trim(item.substr(0, equals)));
    const std::string value(trim(item.substr(equals + 1)));
    GRADCOMP_CHECK(is_identifier(key), "bad compressor spec \"{}\": parameter name \"{}\" is not valid", original, key);
    GRADCOMP_CHECK(!value.empty() && value.find_first_of("=:") == std::string::npos,
                   "bad compressor spec \"{}\": parameter \"{}\" has an empty or malformed value", original, key);
    for (const auto& [existing, unused] : parsed.params) {
      GRADCOMP_CHECK(existing != key, "bad compressor spec \"{}\": parameter \"{}\" is given twice", original, key);
    }
    parsed.params.emplace_back(key, value);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return parsed;
}

std::string describe_param_type(const ParamSpec& param) {
  const char open = param.min_exclusive ? '(' : '[';
  switch (param.kind) {
    case ParamSpec::Kind::kInt: return fmt::format("int {}{}, {}]", open, param.min, param.max);
    case ParamSpec::Kind::kFloat: return fmt::format("float {}{}, {}]", open, param.min, param.max);
    case ParamSpec::Kind::kBool: return "on|off";
    case ParamSpec::Kind::kChoice: return fmt::format("{}", fmt::join(param.choices, "|"));
  }
  return "?";
}

// Returns the canonical text of `raw` for `param`, or throws InvalidArgument.
std::string normalize_param_value(std::string_view codec, const ParamSpec& param, const std::string& raw) {
  auto fail = [&](std::string_view why) -> InvalidArgument {
    return InvalidArgument(fmt::format("compressor '{}': parameter {}={} {} (expected {}: {})", codec, param.name, raw,
                                       why, describe_param_type(param), param.help));
  };
  switch (param.kind) {
    case ParamSpec::Kind::kBool: {
      if (raw == "on" || raw == "true" || raw == "1" || raw == "yes") return "on";
      if (raw == "off" || raw == "false" || raw == "0" || raw == "no") return "off";
      throw fail("is not a boolean");
    }
    case ParamSpec::Kind::kChoice: {
      if (std::find(param.choices.begin(), param.choices.end(), raw) != param.choices.end()) return raw;
      throw fail("is not one of the choices");
    }
    case ParamSpec::Kind::kInt:
    case ParamSpec::Kind::kFloat: {
      errno = 0;
      char* end = nullptr;
      double value = 0;
      if (param.kind == ParamSpec::Kind::kInt) {
        const long long integer = std::strtoll(raw.c_str(), &end, 10);
        if (end != raw.c_str() + raw.size() || errno != 0) throw fail("is not an integer");
        value = static_cast<double>(integer);
      } else {
        value = std::strtod(raw.c_str(), &end);
        if (end != raw.c_str() + raw.size() || errno != 0 || !std::isfinite(value)) throw fail("is not a number");
      }
      const bool below = param.min_exclusive ? value <= param.min : value < param.min;
      if (below || value > param.max) throw fail("is out of range");
      return param.kind == ParamSpec::Kind::kInt ? fmt::format("{}", static_cast<long long>(value))
                                                 : format_number(value);
    }
  }
  throw fail("has an unknown kind");
}

Params::Params(std::string codec, std::map<std::string, std::string> values, std::vector<std::string> given)
    : codec_(std::move(codec)), values_(std::move(values)), given_(std::move(given)) {}

bool Params::has(std::string_view key) const { return values_.count(std::string(key)) > 0; }

bool Params::given(std::string_view key) const {
  return std::find(given_.begin(), given_.end(), key) != given_.end();
}

const std::string& Params::get_string(std::string_view key) const {
  const auto it = values_.find(std::string(key));
  GRADCOMP_ASSERT(it != values_.end(), "compressor '{}' has no value for parameter '{}'", codec_, key);
  return it->second;
}

long long Params::get_int(std::string_view key) const { return std::strtoll(get_string(key).c_str(), nullptr, 10); }
double Params::get_float(std::string_view key) const { return std::strtod(get_string(key).c_str(), nullptr); }
bool Params::get_bool(std::string_view key) const { return get_string(key) == "on"; }

std::string Params::canonical(const std::vector<ParamSpec>& order) const {
  std::vector<std::string> parts;
  for (const auto& param : order) {
    const auto it = values_.find(param.name);
    if (it != values_.end()) parts.push_back(fmt::format("{}={}", param.name, it->second));
  }
  if (order.empty()) {  // undeclared parameters (CompressorInfo::open_params): every value, in key order
    for (const auto& [key, value] : values_) parts.push_back(fmt::format("{}={}", key, value));
  }
  return parts.empty() ? codec_ : fmt::format("{}:{}", codec_, fmt::join(parts, ","));
}

}  // namespace gradcomp
