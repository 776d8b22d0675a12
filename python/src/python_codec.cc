#include "python_codec.h"

#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>

#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "borrowed_tensor.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp::python {

using namespace nb::literals;

namespace {

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void release_object(PyObject* object) {
  if (!Py_IsInitialized() || finalizing()) return;  // leaked on purpose: no interpreter to release it in
  const PyGILState_STATE state = PyGILState_Ensure();
  Py_DECREF(object);
  PyGILState_Release(state);
}

// What a Python exception in `method` of codec `codec` becomes: InvalidArgument for a ValueError or TypeError (bad
// input), else gradcomp::Error; either names the codec, the method, the tensor and the rank. Needs the GIL.
[[noreturn]] void rethrow_python(nb::python_error& e, std::string_view codec, std::string_view method,
                                 std::string_view tensor, int rank) {
  const std::string message = fmt::format("Python codec '{}' raised in {}() of tensor '{}' on rank {}: {}", codec,
                                          method, tensor, rank, e.what());
  if (e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError)) throw InvalidArgument(message);
  throw Error(message);
}

// torch.cuda.stream(ExternalStream(the tensor's stream)) entered for the scope of a CUDA tensor's Python calls, so the
// codec's torch work is ordered after the work that produced the tensor; nothing for a CPU tensor. Needs the GIL.
class TensorStream {
 public:
  explicit TensorStream(const TensorView& tensor) {
    if (!tensor.device().is_cuda()) return;
    nb::object cuda = nb::module_::import_("torch").attr("cuda");
    nb::object stream = tensor.stream() == nullptr
                            ? cuda.attr("default_stream")(tensor.device().index)
                            : cuda.attr("ExternalStream")(reinterpret_cast<std::uintptr_t>(tensor.stream()));
    guard_ = cuda.attr("stream")(stream);
    guard_.attr("__enter__")();
    cuda_ = cuda;
  }
  // Waits for the codec's work on the stream (a communicator reads the round next; the caller reads the result).
  void synchronize() const {
    if (cuda_.is_valid()) cuda_.attr("current_stream")().attr("synchronize")();
  }
  ~TensorStream() {
    if (guard_.is_valid()) guard_.attr("__exit__")(nb::none(), nb::none(), nb::none());
  }

 private:
  nb::object cuda_;
  nb::object guard_;
};

// One named tensor inside the reduced tensor: where it lies, and what its payload was (Python objects in `held`).
struct Part {
  std::string name;
  std::size_t offset = 0;
  std::size_t numel = 0;
  std::size_t begin = 0;  // first f32 of its payload inside the round
  std::size_t count = 0;  // f32 values of its payload
};

class PythonCodec;

// The one round of a Python codec: compress() per part, the payloads' f32 concatenation summed by the driver, then
// decompress() per part with its local ctx.
class PythonRounds final : public RoundReduction {
 public:
  PythonRounds(const PythonCodec& codec, const TensorView& tensor, const CompressContext& ctx);
  ~PythonRounds() override;
  std::span<float> next_round() override;
  void finish(bool average) override;
  std::size_t sent_bytes() const override { return sent_bytes_; }

 private:
  nb::object view_of(const Part& part) const;

  const PythonCodec& codec_;
  TensorView tensor_;
  int rank_ = 0;
  int world_ = 1;
  std::vector<Part> parts_;
  nb::object held_;    // [(ctx, dtype, shape, floating)] per part, and the round's f32 tensor last
  float* round_ = nullptr;
  std::size_t round_numel_ = 0;
  bool handed_out_ = false;
  std::size_t sent_bytes_ = 0;
};

class PythonCodec final : public Compressor {
 public:
  PythonCodec(std::string name, std::string spec, nb::object codec)
      : name_(std::move(name)), spec_(std::move(spec)), codec_(codec) {}

  std::string_view name() const override { return name_; }
  std::string spec() const override { return spec_; }
  CompressorTraits traits() const override { return python_codec_traits(); }
  std::size_t max_payload_bytes(std::size_t numel) const override { return numel * sizeof(float); }

  std::size_t compress(const TensorView&, std::span<std::byte>, const CompressContext& ctx) override {
    throw InvalidArgument(single_payload_message("compress", ctx.name));
  }
  void decompress(PayloadBytes, const TensorView&, DecodeMode) override {
    throw InvalidArgument(single_payload_message("decompress", "payload"));
  }
  std::vector<std::byte> save_state() const override;
  void load_state(std::span<const std::byte> state) override;
  void reset_state() override {}
  void set_threads(int) override {}
  CompressStats last_stats() const override { return stats_; }
  std::unique_ptr<RoundReduction> begin_rounds(const TensorView& tensor, const CompressContext& ctx) override {
    return std::make_unique<PythonRounds>(*this, tensor, ctx);
  }

  nb::handle object() const { return codec_.get(); }
  void clear() { codec_.reset(); }
  void record(std::size_t numel, std::size_t payload_bytes) const {
    stats_ = CompressStats{};
    stats_.numel = numel;
    stats_.selected = numel;
    stats_.payload_bytes = payload_bytes;
  }

 private:
  std::string single_payload_message(std::string_view method, std::string_view what) const {
    return fmt::format("Python codec '{}': {}('{}') of one C++ payload does not exist (its payloads are combined in "
                       "rounds, Horovod's way: the 'rounds' algorithm, or the Python object's own methods)",
                       name_, method, what);
  }

  std::string name_;
  std::string spec_;
  PyRef codec_;
  mutable CompressStats stats_;
};

PythonRounds::PythonRounds(const PythonCodec& codec, const TensorView& tensor, const CompressContext& ctx)
    : codec_(codec), tensor_(tensor), rank_(ctx.rank), world_(ctx.world_size) {
  if (ctx.segments.empty()) {
    parts_.push_back(Part{std::string(ctx.name), 0, tensor.numel()});
  } else {
    for (const TensorSegment& s : ctx.segments) parts_.push_back(Part{std::string(s.name), s.offset, s.numel});
  }
  nb::gil_scoped_acquire gil;
  TensorStream on_stream(tensor);
  nb::module_ torch = nb::module_::import_("torch");
  nb::list held, flats;
  std::size_t begin = 0;
  for (Part& part : parts_) {
    nb::object payload, local;
    try {
      nb::tuple result = nb::cast<nb::tuple>(codec.object().attr("compress")(view_of(part)));
      GRADCOMP_CHECK(result.size() == 2, "Python codec '{}': compress() of tensor '{}' on rank {} returned {} items, "
                     "not (payload, ctx)", codec.name(), part.name, rank_, result.size());
      payload = result[0];
      local = result[1];
      nb::object flat = payload.attr("reshape")(-1).attr("to")(torch.attr("float32"));
      held.append(nb::make_tuple(local, payload.attr("dtype"), payload.attr("shape"),
                                 payload.attr("is_floating_point")()));
      flats.append(flat);
      part.begin = begin;
      part.count = nb::cast<std::size_t>(flat.attr("numel")());
      begin += part.count;
      sent_bytes_ += nb::cast<std::size_t>(payload.attr("numel")()) *
                     nb::cast<std::size_t>(payload.attr("element_size")());
    } catch (nb::python_error& e) {
      rethrow_python(e, codec.name(), "compress", part.name, rank_);
    } catch (const nb::cast_error&) {
      throw InvalidArgument(fmt::format("Python codec '{}': compress() of tensor '{}' on rank {} must return "
                                        "(payload tensor, ctx)", codec.name(), part.name, rank_));
    }
  }
  nb::object round = torch.attr("cat")(flats).attr("contiguous")();
  held.append(round);
  held_ = std::move(held);
  round_ = reinterpret_cast<float*>(nb::cast<std::uintptr_t>(round.attr("data_ptr")()));
  round_numel_ = begin;
  on_stream.synchronize();
  codec.record(tensor.numel(), sent_bytes_);
}

PythonRounds::~PythonRounds() {
  if (!held_.is_valid()) return;
  nb::gil_scoped_acquire gil;
  held_.reset();
}

nb::object PythonRounds::view_of(const Part& part) const {
  const auto* base = static_cast<const std::byte*>(tensor_.data());
  return borrowed_torch_tensor(base + part.offset * dtype_size(tensor_.dtype()), part.numel, tensor_.dtype(),
                               tensor_.device());
}

std::span<float> PythonRounds::next_round() {
  if (handed_out_) return {};
  handed_out_ = true;
  return {round_, round_numel_};
}

void PythonRounds::finish(bool average) {
  nb::gil_scoped_acquire gil;
  TensorStream on_stream(tensor_);
  nb::list held = nb::borrow<nb::list>(held_);
  nb::object round = held[held.size() - 1];
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    const Part& part = parts_[i];
    try {
      nb::tuple info = nb::borrow<nb::tuple>(held[i]);
      nb::object chunk = round.attr("narrow")(0, part.begin, part.count);
      if (average && world_ > 1 && nb::cast<bool>(info[3])) chunk = chunk.attr("__truediv__")(world_);
      nb::object payload = chunk.attr("to")(info[1]).attr("reshape")(info[2]);
      nb::object out = codec_.object().attr("decompress")(payload, info[0]);
      view_of(part).attr("copy_")(out.attr("reshape")(-1));
    } catch (nb::python_error& e) {
      rethrow_python(e, codec_.name(), "decompress", part.name, rank_);
    }
  }
  on_stream.synchronize();
}

std::vector<std::byte> PythonCodec::save_state() const {
  nb::gil_scoped_acquire gil;
  try {
    nb::object state_dict = nb::getattr(object(), "state_dict", nb::none());
    if (!PyCallable_Check(state_dict.ptr())) return {};
    nb::bytes data = nb::cast<nb::bytes>(nb::module_::import_("pickle").attr("dumps")(state_dict()));
    const auto* begin = static_cast<const std::byte*>(data.data());
    return {begin, begin + data.size()};
  } catch (nb::python_error& e) {
    rethrow_python(e, name_, "state_dict", "(state)", -1);
  }
}

void PythonCodec::load_state(std::span<const std::byte> state) {
  if (state.empty()) return;
  nb::gil_scoped_acquire gil;
  nb::object load = nb::getattr(object(), "load_state_dict", nb::none());
  GRADCOMP_CHECK(PyCallable_Check(load.ptr()), "Python codec '{}': a state of {} bytes, but the object has no "
                 "load_state_dict()", name_, state.size());
  nb::object loaded;
  try {
    loaded = nb::module_::import_("pickle").attr("loads")(
        nb::bytes(reinterpret_cast<const char*>(state.data()), state.size()));
  } catch (nb::python_error& e) {
    throw CorruptPayload(fmt::format("Python codec '{}': its state does not unpickle: {}", name_, e.what()));
  }
  try {
    load(loaded);
  } catch (nb::python_error& e) {
    rethrow_python(e, name_, "load_state_dict", "(state)", -1);
  }
}

PythonCodec* as_python_codec(Compressor& compressor) { return dynamic_cast<PythonCodec*>(&compressor); }

}  // namespace

PyObject* python_codec_referent(const Compressor& compressor) {
  const auto* codec = dynamic_cast<const PythonCodec*>(&compressor);
  return codec != nullptr ? codec->object().ptr() : nullptr;
}

void clear_python_codec(Compressor& compressor) {
  if (PythonCodec* codec = as_python_codec(compressor)) codec->clear();
}

PyRef::PyRef(nb::handle object) : ptr_(object.inc_ref().ptr(), release_object) {}

CompressorTraits python_codec_traits() {
  CompressorTraits traits;
  traits.rounds = true;
  traits.lossy = true;
  traits.wire_dtype = DType::kF32;
  return traits;
}

std::unique_ptr<Compressor> make_python_codec(std::string name, std::string spec, nb::object codec) {
  return std::make_unique<PythonCodec>(std::move(name), std::move(spec), std::move(codec));
}

void init_python_codecs(nb::module_& m) {
  m.def(
      "register_python_codec",
      [](std::string name, nb::object factory, std::string summary) {
        CompressorInfo info;
        info.name = name;
        info.summary = std::move(summary);
        info.traits = python_codec_traits();
        info.open_params = true;
        info.factory = [name, factory = PyRef(factory)](const Params& params) {
          nb::gil_scoped_acquire gil;
          const std::string spec = params.canonical({});
          nb::dict values;
          for (const auto& [key, value] : params.values()) values[key.c_str()] = value;
          try {
            return make_python_codec(name, spec, factory.get()(values));
          } catch (nb::python_error& e) {
            throw InvalidArgument(fmt::format("compressor '{}': {}", spec, e.what()));
          }
        };
        default_registry().add(std::move(info));
      },
      "name"_a, "factory"_a, "summary"_a,
      "Adds a Python codec kind to the one registry: factory(params: dict of str) returns the codec object.");
  m.def(
      "unregister_python_codec",
      [](std::string_view name) {
        if (!default_registry().contains(name)) return false;
        GRADCOMP_CHECK(default_registry().info(name).open_params, "unregister_compressor('{}'): not a "
                       "Python-registered codec (built-in and C++ kinds stay)", name);
        return default_registry().remove(name);
      },
      "name"_a);
  m.def(
      "wrap_python_codec",
      [](std::string name, nb::object codec) { return make_python_codec(name, name, std::move(codec)); }, "name"_a,
      "codec"_a, "A Compressor over a Python codec object that is not registered (passed as compression=, as in "
      "Horovod).");
  m.def(
      "python_codec_object",
      [](Compressor& compressor) -> nb::object {
        PythonCodec* codec = as_python_codec(compressor);
        return codec != nullptr && codec->object().is_valid() ? nb::borrow(codec->object()) : nb::none();
      },
      "compressor"_a, "The Python object of a Python codec's Compressor; None for a C++ codec.");
}

}  // namespace gradcomp::python
