#include "src/runtime/policy.h"

#include <fmt/format.h>

#include "gradcomp/registry.h"

namespace gradcomp::runtime {

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative matcher with single-star backtracking: linear in practice, no recursion.
  std::size_t p = 0, t = 0;
  std::size_t star = std::string_view::npos, star_text = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string resolve_spec(const CompressionPolicy& policy, std::string_view name, std::size_t bytes) {
  if (bytes < policy.min_compress_bytes) return "none";
  for (const PolicyRule& rule : policy.rules) {
    if (glob_match(rule.pattern, name)) return rule.spec;
  }
  return policy.default_spec.empty() ? std::string("none") : policy.default_spec;
}

std::string canonical_spec(std::string_view spec) {
  if (spec == kAutoSpec) return std::string(kAutoSpec);
  return default_registry().parse(spec).canonical;
}

}  // namespace gradcomp::runtime
