// Registration functions of the _gradcomp module's parts, and what they share.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>

namespace gradcomp::python {

// Compressor class, make_compressor, list_compressors, canonical_spec.
void init_compressors(nanobind::module_& m);
// The one state envelope: seal_state, open_state, state_envelope_version, state_checksum.
void init_state(nanobind::module_& m);
// Communicators, compressed_allreduce and the Runtime.
void init_comm(nanobind::module_& m);
// TorchCommunicator (a Communicator over a torch.distributed process group) and ExchangeWorker (where the library has
// the collectives).
void init_torch(nanobind::module_& m);

// The Python exception object for a C++ exception: gradcomp errors become instances of the gradcomp.<Class> of the
// same name, a nanobind python_error its own exception, anything else a RuntimeError. Needs the GIL.
nanobind::object python_exception(const std::exception_ptr& error);

}  // namespace gradcomp::python
