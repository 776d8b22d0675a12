// Python codecs (Horovod's shape: compress(tensor) -> (payload, ctx), decompress(payload, ctx) -> tensor) as C++
// Compressors, so that the one registry holds them and every component builds them: compressed_allreduce, the fusion
// runtime (its background thread), the DDP hook's worker and DistributedOptimizer.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "gradcomp/compressor.h"

namespace gradcomp::python {

namespace nb = nanobind;

// A strong reference to a Python object that any thread may drop: the last copy takes the GIL to release it, and
// leaks it on purpose once the interpreter is finalizing or gone (a registry entry destroyed at static destruction).
class PyRef {
 public:
  PyRef() = default;
  // Needs the GIL.
  explicit PyRef(nb::handle object);
  nb::handle get() const { return ptr_.get(); }
  void reset() { ptr_.reset(); }

 private:
  std::shared_ptr<PyObject> ptr_;
};

// A Compressor over the Python codec object `codec`, named `name`, with canonical spec `spec`. Its traits say
// `rounds` (one f32 round): every rank's payload tensor (converted to float32) is summed in rank order, divided by the
// world size for an average when the payload is floating point, converted back to the payload's dtype and shape and
// decoded with the local ctx (Horovod's combination), per named segment, so fusion never changes a tensor's bits. The
// codec sees each segment as a flat torch tensor viewing the caller's memory (no copy), valid during the call only;
// a CUDA tensor's calls run under torch.cuda.stream of the tensor's stream.
// Each call into Python takes the GIL; a Python exception becomes gradcomp::InvalidArgument (ValueError, TypeError)
// or gradcomp::Error naming the codec, the method, the tensor and the rank. compress()/decompress() of one payload
// throw InvalidArgument (the ctx never leaves the rank; gradcomp.PythonCompressor calls the object itself).
// save_state()/load_state() carry the pickled state_dict() of the object (empty when it has none). Needs the GIL.
std::unique_ptr<Compressor> make_python_codec(std::string name, std::string spec, nb::object codec);

// The Python object a Python codec's Compressor holds (nullptr for any other Compressor), and dropping it: the
// Compressor type's cyclic-GC slots (a codec object whose globals hold its own Compressor is a cycle through C++).
PyObject* python_codec_referent(const Compressor& compressor);
void clear_python_codec(Compressor& compressor);

// The traits of every Python codec (rounds, lossy, f32 rounds).
CompressorTraits python_codec_traits();

// register_python_codec, unregister_python_codec, wrap_python_codec, python_codec_object.
void init_python_codecs(nb::module_& m);

}  // namespace gradcomp::python
