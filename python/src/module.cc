// The gradcomp._gradcomp extension: compressors, the registry and the error classes. Tensors cross zero-copy through
// DLPack (see tensor_cast.h); the Pythonic API lives in the gradcomp package (python/gradcomp/).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <span>
#include <string>

#include "bindings.h"
#include "python_codec.h"
#include "gradcomp/compressor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "tensor_cast.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gradcomp::python {
namespace {

// Python classes of the C++ errors; created in init_errors, owned by the module.
PyObject* g_error = nullptr;
PyObject* g_invalid_argument = nullptr;
PyObject* g_comm_error = nullptr;
PyObject* g_cuda_error = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_corrupt_payload = nullptr;

PyObject* new_error(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("gradcomp.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

// InvalidArgument is also a ValueError and Timeout a TimeoutError, so generic `except` clauses keep working.
void init_errors(nb::module_& m) {
  g_error = new_error(m, "Error", PyExc_RuntimeError, "Base class of every gradcomp error.");
  nb::object ia_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_invalid_argument = new_error(m, "InvalidArgument", ia_bases.ptr(),
                                 "Bad spec, parameter, dtype or shape (also a ValueError).");
  g_comm_error = new_error(m, "CommError", g_error, "A communication backend failed.");
  g_cuda_error = new_error(m, "CudaError", g_error, "A CUDA call or kernel failed.");
  nb::object to_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_TimeoutError));
  g_timeout = new_error(m, "Timeout", to_bases.ptr(), "A blocking wait exceeded its deadline (also a TimeoutError).");
  g_corrupt_payload = new_error(m, "CorruptPayload", g_error, "A payload failed validation on decode.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(g_invalid_argument, e.what());
    } catch (const CorruptPayload& e) {
      PyErr_SetString(g_corrupt_payload, e.what());
    } catch (const CommError& e) {
      PyErr_SetString(g_comm_error, e.what());
    } catch (const CudaError& e) {
      PyErr_SetString(g_cuda_error, e.what());
    } catch (const Timeout& e) {
      PyErr_SetString(g_timeout, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

nb::dict traits_dict(const CompressorTraits& t) {
  nb::dict d;
  d["summable"] = t.summable;
  d["gatherable"] = t.gatherable;
  d["requantizable"] = t.requantizable;
  d["rounds"] = t.rounds;
  d["lossy"] = t.lossy;
  d["wire_dtype"] = std::string(dtype_name(t.wire_dtype));
  return d;
}

nb::dict stats_dict(const CompressStats& s) {
  nb::dict d;
  d["numel"] = s.numel;
  d["payload_bytes"] = s.payload_bytes;
  d["selected"] = s.selected;
  d["saturated"] = s.saturated;
  d["nonfinite"] = s.nonfinite;
  d["skipped"] = s.skipped;
  return d;
}

nb::dict info_dict(const CompressorInfo& info) {
  nb::dict d;
  d["name"] = info.name;
  d["summary"] = info.summary;
  d["traits"] = traits_dict(info.traits);
  nb::list params;
  for (const ParamSpec& p : info.params) {
    nb::dict pd;
    pd["name"] = p.name;
    pd["type"] = describe_param_type(p);
    pd["default"] = p.default_value;
    pd["help"] = p.help;
    params.append(pd);
  }
  d["params"] = params;
  d["positional"] = info.positional;
  d["open_params"] = info.open_params;
  return d;
}

std::span<const std::byte> bytes_of(const TensorView& view) {
  return {static_cast<const std::byte*>(view.data()), view.bytes()};
}

// Cyclic GC of Compressor objects: a Python codec's Compressor holds its Python object, which may hold the Compressor.
int compressor_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  PyObject* held = python_codec_referent(*nb::inst_ptr<Compressor>(self));
  Py_VISIT(held);
  return 0;
}

int compressor_clear(PyObject* self) {
  if (nb::inst_ready(self)) clear_python_codec(*nb::inst_ptr<Compressor>(self));
  return 0;
}

PyType_Slot compressor_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(compressor_traverse)},
                                  {Py_tp_clear, reinterpret_cast<void*>(compressor_clear)},
                                  {0, nullptr}};

}  // namespace

nb::object python_exception(const std::exception_ptr& error) {
  PyObject* type = PyExc_RuntimeError;
  std::string message = "unknown C++ exception";
  try {
    std::rethrow_exception(error);
  } catch (nb::python_error& e) {
    return nb::borrow(e.value());
  } catch (const InvalidArgument& e) {
    type = g_invalid_argument;
    message = e.what();
  } catch (const CorruptPayload& e) {
    type = g_corrupt_payload;
    message = e.what();
  } catch (const CommError& e) {
    type = g_comm_error;
    message = e.what();
  } catch (const CudaError& e) {
    type = g_cuda_error;
    message = e.what();
  } catch (const Timeout& e) {
    type = g_timeout;
    message = e.what();
  } catch (const Error& e) {
    type = g_error;
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
  }
  return nb::handle(type)(message);
}

void init_compressors(nb::module_& m) {
  nb::class_<Compressor>(m, "Compressor", "A C++ gradient codec with per-tensor error-feedback state.",
                         nb::type_slots(compressor_slots))
      .def_prop_ro("name", [](const Compressor& c) { return std::string(c.name()); })
      .def_prop_ro("spec", &Compressor::spec)
      .def_prop_ro("traits", [](const Compressor& c) { return traits_dict(c.traits()); })
      .def("max_payload_bytes", &Compressor::max_payload_bytes, "numel"_a)
      .def(
          "compress_into",
          [](Compressor& c, const InArray& grad, const OutArray& out, std::string_view name, std::uint64_t step,
             int rank, int world_size, float prescale, std::uintptr_t stream) {
            const TensorView g = to_view(grad, fmt::format("compress('{}') input", name), stream);
            const TensorView o = to_view(out, fmt::format("compress('{}') output buffer", name), stream);
            GRADCOMP_CHECK(o.dtype() == DType::kU8, "compress('{}'): the output buffer must be uint8, got {}", name,
                           dtype_name(o.dtype()));
            GRADCOMP_CHECK(o.device() == g.device(), "compress('{}'): output buffer on {} but the gradient on {}",
                           name, device_name(o.device()), device_name(g.device()));
            const CompressContext ctx{
                .name = name, .step = step, .rank = rank, .world_size = world_size, .prescale = prescale};
            nb::gil_scoped_release release;
            return c.compress(g, {static_cast<std::byte*>(o.data()), o.bytes()}, ctx);
          },
          "grad"_a, "out"_a, "name"_a, "step"_a = 0, "rank"_a = 0, "world_size"_a = 1, "prescale"_a = 1.0f,
          "stream"_a = 0,
          "Compresses `grad` into the uint8 buffer `out` (>= max_payload_bytes); returns the payload size.")
      .def(
          "decompress_into",
          [](Compressor& c, const InArray& payload, const OutArray& out, bool accumulate, std::uintptr_t stream) {
            const TensorView p = to_view(payload, "decompress() payload", stream);
            const TensorView o = to_view(out, "decompress() output", stream);
            GRADCOMP_CHECK(p.dtype() == DType::kU8, "decompress(): the payload must be uint8, got {}",
                           dtype_name(p.dtype()));
            nb::gil_scoped_release release;
            c.decompress(PayloadBytes(bytes_of(p), Memory::of(p)), o,
                         accumulate ? DecodeMode::kAccumulate : DecodeMode::kOverwrite);
          },
          "payload"_a, "out"_a, "accumulate"_a = false, "stream"_a = 0,
          "Decodes `payload` into `out` (overwrites, or adds when accumulate=True).")
      .def("save_state",
           [](const Compressor& c) {
             const std::vector<std::byte> state = c.save_state();
             return nb::bytes(reinterpret_cast<const char*>(state.data()), state.size());
           })
      .def(
          "load_state",
          [](Compressor& c, nb::bytes state) {
            c.load_state({reinterpret_cast<const std::byte*>(state.c_str()), state.size()});
          },
          "state"_a)
      .def("reset_state", &Compressor::reset_state)
      .def("set_threads", &Compressor::set_threads, "threads"_a)
      .def("last_stats", [](const Compressor& c) { return stats_dict(c.last_stats()); });

  m.def(
      "make_compressor", [](std::string_view spec) { return make_compressor(spec); }, "spec"_a,
      "A new compressor from a spec string such as 'topk:ratio=0.01'.");
  m.def(
      "canonical_spec",
      [](std::string_view spec) { return default_registry().parse(spec).canonical; }, "spec"_a,
      "Validates a spec and spells out every parameter (equivalent spellings give the same string).");
  m.def(
      "parse_spec",
      [](std::string_view spec) {
        const ParsedSpec parsed = parse_spec(spec);
        nb::list pairs;
        for (const auto& [key, value] : parsed.params) pairs.append(nb::make_tuple(key, value));
        return nb::make_tuple(parsed.name, pairs);
      },
      "spec"_a,
      "The spec's syntax only, (name, [(key, value), ...]) in order, for any codec (Python-registered ones too);\n"
      "raises InvalidArgument on a syntax error.");
  m.def("list_compressors", []() {
    nb::list out;
    for (const CompressorInfo& info : default_registry().list()) out.append(info_dict(info));
    return out;
  });
  m.def(
      "compressor_info", [](std::string_view name) { return info_dict(default_registry().info(name)); }, "name"_a);
}

}  // namespace gradcomp::python

NB_MODULE(_gradcomp, m) {
  m.doc() = "gradcomp C++ core (use the gradcomp package, not this module)";
  gradcomp::python::init_errors(m);
  gradcomp::python::init_compressors(m);
  gradcomp::python::init_python_codecs(m);
  gradcomp::python::init_state(m);
  gradcomp::python::init_comm(m);
  gradcomp::python::init_torch(m);
}
