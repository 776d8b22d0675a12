// gradcomp error model: every host API reports failure by throwing a subclass of gradcomp::Error whose message names
// the tensor, the rank and the offending values. Background threads never throw across threads; they store the
// exception and the waiter rethrows it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace gradcomp {

// Base of every gradcomp exception. `what()` is a complete, human-readable sentence.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A caller passed something invalid: unknown compressor, bad parameter, mismatched shapes/dtypes across ranks.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A communication backend failed (MPI/NCCL error, peer rank died, protocol mismatch).
class CommError : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime call or kernel launch failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

// A blocking wait exceeded its deadline.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A payload failed validation on decode (bad magic, version, codec, sizes, truncated, out-of-range indices).
class CorruptPayload : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* condition, const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace gradcomp

// Throws gradcomp::InvalidArgument with an fmt-formatted message when `cond` is false.
#define GRADCOMP_CHECK(cond, ...)                                                    \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      throw ::gradcomp::InvalidArgument(::fmt::format(__VA_ARGS__));                 \
    }                                                                                \
  } while (0)

// Throws the given gradcomp::Error subclass with an fmt-formatted message when `cond` is false.
#define GRADCOMP_CHECK_AS(ErrorType, cond, ...)                                      \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      throw ErrorType(::fmt::format(__VA_ARGS__));                                   \
    }                                                                                \
  } while (0)

// Internal invariant: failure is a gradcomp bug; the message includes file and line.
#define GRADCOMP_ASSERT(cond, ...)                                                               \
  do {                                                                                           \
    if (!(cond)) [[unlikely]] {                                                                  \
      ::gradcomp::detail::throw_check_failure(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                            \
  } while (0)
