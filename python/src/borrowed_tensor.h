// Torch tensors that view memory gradcomp owns (a communicator's buffers, a caller's tensor), handed to
// torch.distributed for one collective.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>

#include "gradcomp/tensor.h"

namespace gradcomp::python {

namespace nb = nanobind;

// A 1-D torch tensor of `numel` elements of `dtype` at `data` on `device`, not owning the memory: the caller keeps it
// valid until the collective that uses the tensor has completed. Releasing the tensor never takes the GIL, so torch's
// own threads (gloo's work loop, which may drop the last reference after Python has begun to exit) can release it at
// any time. Needs the GIL.
nb::object borrowed_torch_tensor(const void* data, std::size_t numel, DType dtype, Device device);

}  // namespace gradcomp::python
