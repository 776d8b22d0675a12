// Compressor catalog and spec strings: "topk:ratio=0.01,ef=on" names a codec and its parameters.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradcomp/compressor.h"

namespace gradcomp {

// One declared parameter of a compressor.
struct ParamSpec {
  enum class Kind { kInt, kFloat, kBool, kChoice };
  std::string name;
  Kind kind = Kind::kFloat;
  std::string default_value;       // "" = no default (the parameter is optional and absent unless given)
  double min = 0.0;                // inclusive range for kInt / kFloat
  double max = 0.0;
  bool min_exclusive = false;      // range is (min, max] instead of [min, max]
  std::vector<std::string> choices;  // for kChoice; kBool accepts on/off/true/false/1/0
  std::string help;
  // Another parameter this one replaces (topk: k replaces ratio): giving both is an error, and when this one is
  // given the other takes no default. "" = none.
  std::string excludes = {};
};

// "int [1, 8]", "float (0, 1]", "on|off", "max|l2".
std::string describe_param_type(const ParamSpec& param);

// A spec string split into its name and key=value pairs, in order. Syntax only; no validation against a codec.
struct ParsedSpec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;
};

// Parses "name[:k=v[,k=v...]]". Throws InvalidArgument with the position of a syntax error.
ParsedSpec parse_spec(std::string_view spec);

// Validated parameter values of one compressor instance: every declared parameter with its given or default value.
class Params {
 public:
  Params() = default;
  Params(std::string codec, std::map<std::string, std::string> values, std::vector<std::string> explicitly_given);

  bool has(std::string_view key) const;              // has a value (given or defaulted)
  bool given(std::string_view key) const;            // spelled out in the spec
  long long get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const std::map<std::string, std::string>& values() const { return values_; }
  // "name:k=v,..." with every parameter that has a value, in `order`; an empty `order` (undeclared parameters,
  // CompressorInfo::open_params) gives every value in key order.
  std::string canonical(const std::vector<ParamSpec>& order) const;

 private:
  std::string codec_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> given_;
};

// Throws InvalidArgument, quoting `name` and the rule, unless `name` matches [a-z0-9_]+ (ASCII only: "ñame", "Top",
// "a-b" and "" are refused). Every registration path checks names with this: Registry::add, and the Python
// register_compressor (python/gradcomp/_compressors.py).
void check_compressor_name(std::string_view name, std::string_view context = "compressor name");

// A registered compressor kind.
struct CompressorInfo {
  std::string name;
  std::string summary;
  CompressorTraits traits;
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<Compressor>(const Params&)> factory;
  // The parameter a positional argument sets in Python's Compression.<name>(x) (e.g. "ratio"); "" = none.
  std::string positional = {};
  // Parameters are not declared (`params` is empty): every key=value of a spec reaches the factory as given, which
  // checks them (Python-registered codecs, whose constructor does). The canonical spec keeps them in sorted order.
  bool open_params = false;
};

// A spec parsed once and validated against its kind: what every component receives instead of re-parsing the
// string. Equivalent spellings ("topk", "topk:ratio=0.01", "topk:ef=true,ratio=0.010") give equal values.
struct CompressorSpec {
  std::string name;
  Params params;             // every declared parameter with its given or default value, normalized
  CompressorTraits traits;
  std::string canonical;     // "name:k=v,..." with every valued parameter in declaration order: the spec's identity

  bool operator==(const CompressorSpec& other) const { return canonical == other.canonical; }
};

// A catalog of compressor kinds. Thread-safe.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A registry holding every built-in compressor (none, fp16, bf16, qsgd, ...).
  static std::unique_ptr<Registry> with_builtins();

  // Adds a kind. Throws InvalidArgument if the name is taken or not [a-z0-9_]+ (check_compressor_name).
  void add(CompressorInfo info);
  // Removes a kind; false if none had that name. A reference from info() to it must no longer be in use.
  bool remove(std::string_view name);
  bool contains(std::string_view name) const;
  // Throws InvalidArgument listing the registered names if unknown.
  const CompressorInfo& info(std::string_view name) const;
  // Every registered kind, sorted by registration order.
  std::vector<CompressorInfo> list() const;

  // Validates a spec against the declared parameters: unknown names, unknown parameters, unparsable or out-of-range
  // values raise InvalidArgument whose message lists what is valid.
  Params validate(std::string_view spec) const;
  // validate() plus the kind's traits and the canonical string. Same errors as validate().
  CompressorSpec parse(std::string_view spec) const;
  // The kind's factory on a parsed spec (or parse() first).
  std::unique_ptr<Compressor> create(const CompressorSpec& spec) const;
  std::unique_ptr<Compressor> create(std::string_view spec) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<CompressorInfo>> infos_;
};

// The process's catalog of compressor *kinds* (factories, not runtime state), holding the built-ins; custom kinds
// registered from C++ or Python are added here so every component that takes a spec can build them.
Registry& default_registry();

// default_registry().create(spec).
std::unique_ptr<Compressor> make_compressor(std::string_view spec);

}  // namespace gradcomp
