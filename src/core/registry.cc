// The generic part of the compressor registry: adding kinds and validating specs against their declared parameters.
#include "gradcomp/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "gradcomp/error.h"

namespace gradcomp {

std::string normalize_param_value(std::string_view codec, const ParamSpec& param, const std::string& raw);

namespace {
std::string names_of(const std::vector<std::unique_ptr<CompressorInfo>>& infos) {
  std::vector<std::string> names;
  for (const auto& info : infos) names.push_back(info->name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string describe_params(const CompressorInfo& info) {
  if (info.params.empty()) return "it takes no parameters";
  std::vector<std::string> parts;
  for (const auto& param : info.params) {
    parts.push_back(param.default_value.empty()
                        ? fmt::format("{} ({})", param.name, describe_param_type(param))
                        : fmt::format("{} ({}, default {})", param.name, describe_param_type(param),
                                      param.default_value));
  }
  return fmt::format("valid parameters: {}", fmt::join(parts, "; "));
}
}  // namespace

void check_compressor_name(std::string_view name, std::string_view context) {
  // Byte by byte: every byte of a UTF-8 multi-byte character (>= 0x80) is outside the ASCII ranges below.
  const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  GRADCOMP_CHECK(valid, "{} '{}' is not valid: names must match [a-z0-9_]+ (ASCII lower-case letters, digits, '_')",
                 context, name);
}

void Registry::add(CompressorInfo info) {
  check_compressor_name(info.name);
  GRADCOMP_CHECK(static_cast<bool>(info.factory), "compressor '{}' has no factory", info.name);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& existing : infos_) {
    GRADCOMP_CHECK(existing->name != info.name, "a compressor named '{}' is already registered", info.name);
  }
  infos_.push_back(std::make_unique<CompressorInfo>(std::move(info)));
}

bool Registry::remove(std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = std::find_if(infos_.begin(), infos_.end(), [&](const auto& info) { return info->name == name; });
  if (it == infos_.end()) return false;
  infos_.erase(it);
  return true;
}

bool Registry::contains(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(infos_.begin(), infos_.end(), [&](const auto& info) { return info->name == name; });
}

const CompressorInfo& Registry::info(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& info : infos_) {
    if (info->name == name) return *info;
  }
  throw InvalidArgument(fmt::format("unknown compressor '{}' (registered: {})", name, names_of(infos_)));
}

std::vector<CompressorInfo> Registry::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CompressorInfo> result;
  for (const auto& info : infos_) result.push_back(*info);
  return result;
}

Params Registry::validate(std::string_view spec) const {
  const ParsedSpec parsed = parse_spec(spec);
  const CompressorInfo& kind = info(parsed.name);
  std::map<std::string, std::string> values;
  std::vector<std::string> given;
  for (const auto& entry : parsed.params) {
    // Not a structured binding: clang 14 (the fuzz build's compiler) cannot capture one in a lambda.
    const std::string& key = entry.first;
    const std::string& raw = entry.second;
    if (kind.open_params) {
      values[key] = raw;
      given.push_back(key);
      continue;
    }
    const auto it = std::find_if(kind.params.begin(), kind.params.end(), [&](const auto& p) { return p.name == key; });
    GRADCOMP_CHECK(it != kind.params.end(), "compressor '{}' has no parameter '{}' ({})", kind.name, key,
                   describe_params(kind));
    values[key] = normalize_param_value(kind.name, *it, raw);
    given.push_back(key);
  }
  std::vector<std::string> excluded;
  for (const auto& param : kind.params) {
    if (param.excludes.empty() || !values.count(param.name)) continue;
    GRADCOMP_CHECK(!values.count(param.excludes), "compressor '{}': give either {} or {}, not both (got {}={}, {}={})",
                   kind.name, param.excludes, param.name, param.excludes, values[param.excludes], param.name,
                   values[param.name]);
    excluded.push_back(param.excludes);
  }
  for (const auto& param : kind.params) {
    const bool is_excluded = std::find(excluded.begin(), excluded.end(), param.name) != excluded.end();
    if (!values.count(param.name) && !param.default_value.empty() && !is_excluded) {
      values[param.name] = param.default_value;
    }
  }
  return Params(kind.name, std::move(values), std::move(given));
}

CompressorSpec Registry::parse(std::string_view spec) const {
  CompressorSpec out;
  out.params = validate(spec);
  const CompressorInfo& kind = info(parse_spec(spec).name);
  out.name = kind.name;
  out.traits = kind.traits;
  out.canonical = out.params.canonical(kind.params);

  return out;
}

std::unique_ptr<Compressor> Registry::create(const CompressorSpec& spec) const {
  std::function<std::unique_ptr<Compressor>(const Params&)> factory;
  {
    const CompressorInfo& kind = info(spec.name);
    factory = kind.factory;
  }
  auto compressor = factory(spec.params);
  GRADCOMP_ASSERT(compressor != nullptr, "factory of '{}' returned null", spec.name);
  return compressor;
}

std::unique_ptr<Compressor> Registry::create(std::string_view spec) const { return create(parse(spec)); }

std::unique_ptr<Compressor> make_compressor(std::string_view spec) { return default_registry().create(spec); }

}  // namespace gradcomp
