#include "gradcomp/error.h"

namespace gradcomp::detail {

void throw_check_failure(const char* condition, const char* file, int line, const std::string& message) {
  throw Error(fmt::format("gradcomp internal error: {} ({} failed at {}:{})", message, condition, file, line));
}

}  // namespace gradcomp::detail
