// The built-in compressors, registered explicitly from the codec table (no static-initialization tricks), and the
// process catalog.
#include "gradcomp/registry.h"

#include "compressors/framework/codec_table.h"
#include "gradcomp/error.h"

namespace gradcomp {

namespace {
void register_builtins(Registry& registry) {
  for (const CodecRow& row : builtin_codecs()) {
    CompressorInfo info = row.info();
    GRADCOMP_ASSERT(info.name == row.name, "codec table row '{}' builds kind '{}'", row.name, info.name);
    info.positional = std::string(row.positional);
    registry.add(std::move(info));
  }
}
}  // namespace

std::unique_ptr<Registry> Registry::with_builtins() {
  auto registry = std::make_unique<Registry>();
  register_builtins(*registry);
  return registry;
}

Registry& default_registry() {
  static const std::unique_ptr<Registry> registry = Registry::with_builtins();
  return *registry;
}

}  // namespace gradcomp
