// Registration functions of the _gradcomp module's parts.
#pragma once

#include <nanobind/nanobind.h>

namespace gradcomp::python {

// Compressor class, make_compressor, list_compressors, canonical_spec.
void init_compressors(nanobind::module_& m);
// Communicators, compressed_allreduce and the Runtime, where the library has them (has_mpi / has_runtime flags).
void init_comm(nanobind::module_& m);

}  // namespace gradcomp::python
