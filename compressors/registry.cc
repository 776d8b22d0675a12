// The built-in compressors, registered explicitly (no static-initialization tricks), and the process catalog.
#include "gradcomp/registry.h"

#include "compressors/none.h"

// Quantizers (one include each, below this line).
#include "compressors/bf16.h"
#include "compressors/fp16.h"
#include "compressors/onebit.h"
#include "compressors/qsgd.h"
#include "compressors/terngrad.h"


// Sparsifiers (one include each, below this line).
#include "compressors/blocktopk.h"
#include "compressors/dgc.h"
#include "compressors/randomk.h"
#include "compressors/topk.h"


namespace gradcomp {

namespace {
void register_builtins(Registry& registry) {
  registry.add(none_compressor_info());

  // Quantizers: fp16, bf16, qsgd, terngrad, onebit (one line each, below this comment).
  registry.add(fp16_compressor_info());
  registry.add(bf16_compressor_info());
  registry.add(qsgd_compressor_info());
  registry.add(terngrad_compressor_info());
  registry.add(onebit_compressor_info());


  // Sparsifiers: topk, randomk, blocktopk, dgc (one line each, below this comment).
  registry.add(topk_compressor_info());
  registry.add(randomk_compressor_info());
  registry.add(blocktopk_compressor_info());
  registry.add(dgc_compressor_info());

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
