#include "src/runtime/fusion.h"

#include <cstdint>

namespace gradcomp::runtime {

std::byte* FusionArena::get(std::size_t bytes) {
  if (bytes > capacity_) {
    storage_.assign(bytes + 64, std::byte{0});
    capacity_ = bytes;
    ++allocations_;
  }
  auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
  return storage_.data() + ((64 - address % 64) % 64);
}

}  // namespace gradcomp::runtime
