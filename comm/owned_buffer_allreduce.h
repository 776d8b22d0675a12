// An optional capability of a communicator that only ever hands its transport memory it owns (MPI: an abandoned
// request must never write into a caller's freed buffer, so a plain allreduce copies the caller's bytes in and the
// result out). Such a communicator can instead let the caller write its payload straight into that memory and read
// the result from it: the dense algorithm then makes two passes over a large tensor (encode, decode) instead of four.
// Found with dynamic_cast; a communicator without it takes the plain allreduce.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "gradcomp/tensor.h"

namespace gradcomp {

class OwnedBufferAllreduce {
 public:
  // The bytes a fill wrote and the part of them that is one array of `count` elements of `dtype` to sum across ranks
  // (a payload's body after its header).
  struct Filled {
    std::size_t bytes = 0;
    std::size_t offset = 0;
    std::size_t count = 0;
    DType dtype = DType::kF32;
  };
  using Fill = std::function<Filled(std::span<std::byte> send)>;
  using Drain = std::function<void(std::span<const std::byte> result)>;

  virtual ~OwnedBufferAllreduce() = default;

  // Sums one array across ranks in the communicator's own host memory: `fill` writes at most `capacity` bytes into
  // the send buffer; the reduction writes the elementwise sum of every rank's array into a result buffer whose other
  // bytes are copied from the send buffer; `drain` reads the result (Filled::bytes long). Both buffers are valid only
  // during the call. Throws as allreduce() does (CommError, Timeout; then `drain` is not called), and
  // InvalidArgument when the array lies outside the bytes written.
  virtual void allreduce_in_owned_buffer(std::size_t capacity, const Fill& fill, const Drain& drain) = 0;
};

}  // namespace gradcomp
