// DLPack arrays (torch CPU/CUDA tensors, NumPy arrays) -> gradcomp::TensorView, zero-copy.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string_view>

#include "gradcomp/tensor.h"

namespace gradcomp::python {

namespace nb = nanobind;

// An array argument of a binding: any Python object, turned into a view by to_view(). Binding parameters take this
// instead of nb::ndarray so that an object nanobind cannot import (a torch.bool tensor, a list) raises
// gradcomp.InvalidArgument naming the tensor and the dtypes accepted, not nanobind's TypeError listing signatures.
// ReadOnly: the binding only reads the memory (a gradient, a payload). Holds a borrowed reference.
template <bool ReadOnly>
struct ArrayArg {
  nb::handle object;
};
using InArray = ArrayArg<true>;   // a read-only input (gradient, payload)
using OutArray = ArrayArg<false>; // a writable output (decompressed tensor, payload buffer, in-place tensor)

// Views the memory of a C-contiguous array of f32, f16, bf16, u8 or i32 on the CPU or a CUDA device. `stream` is a
// cudaStream_t handle (as an integer, 0 = default stream) used only for CUDA arrays. Throws InvalidArgument naming
// `what` for an object that is not a DLPack array, another dtype (its own name in the message, e.g. torch.bool), a
// non-contiguous array or an unsupported device. The view is valid while the Python object lives. Needs the GIL.
TensorView to_view(const InArray& array, std::string_view what, std::uintptr_t stream);
TensorView to_view(const OutArray& array, std::string_view what, std::uintptr_t stream);

}  // namespace gradcomp::python

namespace nanobind::detail {

// Accepts every object; to_view() does the checking (and raises gradcomp's error).
template <bool ReadOnly>
struct type_caster<gradcomp::python::ArrayArg<ReadOnly>> {
  NB_TYPE_CASTER(gradcomp::python::ArrayArg<ReadOnly>, const_name("ndarray"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    value.object = src;
    return true;
  }
  static handle from_cpp(const gradcomp::python::ArrayArg<ReadOnly>& v, rv_policy, cleanup_list*) noexcept {
    return v.object.inc_ref();
  }
};

}  // namespace nanobind::detail
