// Compression policy: name globs -> compressor specs, the dense minimum size, and spec canonicalization.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "gradcomp/runtime.h"

namespace gradcomp::runtime {

inline constexpr std::string_view kAutoSpec = "auto";

// Glob match of the whole `text` against `pattern`: '*' matches any run (also empty), '?' one character.
bool glob_match(std::string_view pattern, std::string_view text);

// The spec `policy` assigns to a tensor `name` of `bytes` bytes: "none" under the minimum size, else the first
// matching rule, else the default. Not canonicalized.
std::string resolve_spec(const CompressionPolicy& policy, std::string_view name, std::size_t bytes);

// Canonical spec ("topk:ratio=0.01,ef=on,...") via the default registry; "auto" stays "auto". Throws InvalidArgument
// for an unknown codec or parameter.
std::string canonical_spec(std::string_view spec);

}  // namespace gradcomp::runtime
