// The throwing half of GRADCOMP_CUDA_CHECK. Needs no CUDA header, so it is part of every build.
#include <string>

#include "gradcomp/error.h"

namespace gradcomp::detail {

[[noreturn]] void throw_cuda_error(int code, const char* name, const char* description, const char* expression,
                                   const char* file, int line, const char* context = nullptr);

void throw_cuda_error(int code, const char* name, const char* description, const char* expression, const char* file,
                      int line, const char* context) {
  throw CudaError(fmt::format("CUDA error {} ({}: {}) from `{}` at {}:{}{}{}{}", code, name ? name : "?",
                              description ? description : "?", expression, file, line, context ? " (" : "",
                              context ? context : "", context ? ")" : ""));
}

}  // namespace gradcomp::detail
