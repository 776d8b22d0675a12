// DLPack arrays (torch CPU/CUDA tensors, NumPy arrays) -> gradcomp::TensorView, zero-copy.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string_view>

#include "gradcomp/tensor.h"

namespace gradcomp::python {

namespace nb = nanobind;

// A read-only input (gradient, payload) and a writable output (decompressed tensor, payload buffer).
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// Views the memory of a C-contiguous array of f32, f16, bf16 or u8 on the CPU or a CUDA device. `stream` is a
// cudaStream_t handle (as an integer, 0 = default stream) used only for CUDA arrays. Throws InvalidArgument naming
// `what` for another dtype, a non-contiguous array or an unsupported device.
TensorView to_view(const nb::ndarray<nb::ro>& array, std::string_view what, std::uintptr_t stream);
TensorView to_view(const nb::ndarray<>& array, std::string_view what, std::uintptr_t stream);

}  // namespace gradcomp::python
