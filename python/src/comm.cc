// Communicators, compressed_allreduce and the fusion Runtime. The module's has_collectives / has_runtime flags are
// always true (kept for scripts that test them).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

#include "bindings.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "tensor_cast.h"

#include <nanobind/stl/vector.h>

#include "allreduce_args.h"
#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/mailbox.h"
#include "gradcomp/runtime.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gradcomp::python {

namespace {
std::span<std::byte> bytes_of(const OutArray& array, std::string_view what) {
  const TensorView view = to_view(array, what, 0);
  GRADCOMP_CHECK(view.device().is_cpu(), "{}: host memory only, got {}", what, view.describe());
  return {static_cast<std::byte*>(view.data()), view.bytes()};
}
}  // namespace

void init_comm(nb::module_& m) {
  m.attr("has_collectives") = true;
  nb::class_<Communicator>(m, "Communicator", "A group of ranks (MPI, NCCL or in-process).")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("backend", &Communicator::backend)
      .def(
          "takes",
          [](const Communicator& c, std::string_view device) {
            if (device == "cpu") return c.takes(Device::cpu());
            GRADCOMP_CHECK(device.starts_with("cuda:"), "takes(): device must be 'cpu' or 'cuda:N', got '{}'", device);
            return c.takes(Device::cuda(std::stoi(std::string(device.substr(5)))));
          },
          "device"_a, "Whether every call takes buffers on `device` ('cpu' or 'cuda:N') without staging.")
      .def(
          "allreduce",
          [](Communicator& c, const OutArray& tensor, std::string_view op, std::uintptr_t stream) {
            const TensorView view = to_view(tensor, "allreduce() tensor", stream);
            nb::gil_scoped_release release;
            with_memory_taken(c, view, [&](const TensorView& taken) { c.allreduce(taken, op_of(op)); });
          },
          "tensor"_a, "op"_a = "sum", "stream"_a = 0)
      .def(
          "broadcast",
          [](Communicator& c, const OutArray& buffer, int root) {
            const TensorView view = to_view(buffer, "broadcast() buffer", 0);
            nb::gil_scoped_release release;
            with_memory_taken(c, view, [&](const TensorView& taken) {
              c.broadcast({static_cast<std::byte*>(taken.data()), taken.bytes()}, root, Memory::of(taken));
            });
          },
          "buffer"_a, "root"_a = 0)
      .def("barrier",
           [](Communicator& c) {
             nb::gil_scoped_release release;
             c.barrier();
           })
      .def(
          "allgather",
          [](Communicator& c, const OutArray& send, const OutArray& recv) {
            const auto s = bytes_of(send, "allgather() send"), r = bytes_of(recv, "allgather() recv");
            nb::gil_scoped_release release;
            c.allgather(s, r);
          },
          "send"_a, "recv"_a, "Byte-wise: recv (size x send bytes) gets every rank's send in rank order.")
      .def(
          "allgatherv",
          [](Communicator& c, const OutArray& send, const std::vector<std::size_t>& counts, const OutArray& recv) {
            const auto s = bytes_of(send, "allgatherv() send"), r = bytes_of(recv, "allgatherv() recv");
            nb::gil_scoped_release release;
            c.allgatherv(s, counts, r);
          },
          "send"_a, "recv_counts"_a, "recv"_a, "Byte-wise allgather with per-rank sizes, packed in rank order.")
      .def(
          "alltoallv",
          [](Communicator& c, const OutArray& send, const std::vector<std::size_t>& send_counts, const OutArray& recv,
             const std::vector<std::size_t>& recv_counts) {
            const auto s = bytes_of(send, "alltoallv() send"), r = bytes_of(recv, "alltoallv() recv");
            nb::gil_scoped_release release;
            c.alltoallv(s, send_counts, r, recv_counts);
          },
          "send"_a, "send_counts"_a, "recv"_a, "recv_counts"_a,
          "Byte-wise: send_counts[d] bytes to rank d (packed in rank order), recv_counts[s] from rank s.")
      .def_prop_rw(
          "timeout_s", [](const Communicator& c) { return static_cast<double>(c.timeout().count()) / 1000.0; },
          [](Communicator& c, double seconds) {
            c.set_timeout(std::chrono::milliseconds(static_cast<long long>(seconds * 1000)));
          },
          "Deadline of every blocking call, in seconds.")
      .def("split", &Communicator::split, "color"_a, "key"_a,
           "A sub-communicator of the ranks with equal color, ordered by key (MPI_Comm_split).");
  m.def(
      "make_local_communicators",
      [](int world_size, double timeout_s) {
        return make_local_communicators(world_size,
                                        std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000)));
      },
      "world_size"_a, "timeout_s"_a = 60.0,
      "world_size in-process communicators (give communicator r to thread r): a reference world for tests.");
  m.def(
      "make_mpi_world_communicator",
      [](double timeout_s) {
        MpiOptions options;
        options.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
        return make_mpi_world_communicator(options);
      },
      "timeout_s"_a = 60.0);
  nb::class_<Mailbox>(m, "Mailbox", "Short notes between the ranks, outside every collective (hvd.join()).")
      .def_prop_ro("rank", &Mailbox::rank)
      .def_prop_ro("size", &Mailbox::size)
      .def(
          "send",
          [](Mailbox& box, int peer, nb::bytes note) {
            const auto* data = reinterpret_cast<const std::byte*>(note.c_str());
            const std::span<const std::byte> bytes(data, note.size());
            nb::gil_scoped_release release;
            box.send(peer, bytes);
          },
          "peer"_a, "note"_a, "Sends `note` (at most 4096 bytes) to rank `peer`.")
      .def(
          "receive",
          [](Mailbox& box, double wait_s, double max_nap_s) -> nb::object {
            std::optional<Note> note;
            {
              nb::gil_scoped_release release;
              note = box.receive(std::chrono::milliseconds(static_cast<long long>(wait_s * 1000)),
                                 std::chrono::microseconds(std::max(1LL, static_cast<long long>(max_nap_s * 1e6))));
            }
            if (!note) return nb::none();
            return nb::make_tuple(note->from, nb::bytes(reinterpret_cast<const char*>(note->bytes.data()),
                                                        note->bytes.size()));
          },
          "wait_s"_a, "max_nap_s"_a = 0.004,
          "(sender, bytes) of the next note, waiting at most wait_s (polling with naps of up to max_nap_s); None when "
          "none came.")
      .def("close", &Mailbox::close, "Ends every receive() under way (within one nap) and makes later ones return None.");
  m.def(
      "make_mpi_world_mailbox",
      [](double timeout_s) {
        return make_mpi_world_mailbox(std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000)));
      },
      "timeout_s"_a = 60.0, "A Mailbox over a duplicate of MPI_COMM_WORLD (collective over the world).");
  m.attr("has_nccl") = static_cast<bool>(GRADCOMP_WITH_NCCL);
  m.attr("has_cuda") = static_cast<bool>(GRADCOMP_WITH_CUDA);  // hvd.cuda_built()
  m.def(
      "make_nccl_communicator",
      [](Communicator& bootstrap, int device) {
        nb::gil_scoped_release release;
        return make_nccl_communicator(bootstrap, device);
      },
      "bootstrap"_a, "device"_a,
      "NCCL communicator over the ranks of `bootstrap` (collective: the unique id travels through it) on CUDA\n"
      "device `device`. Raises CommError in builds without NCCL (see has_nccl).");
  m.def(
      "compressed_allreduce",
      [](Communicator& comm, Compressor& compressor, const OutArray& tensor, std::string_view name,
         std::string_view op, std::uint64_t step, std::uintptr_t stream, nb::handle segments,
         std::string_view algorithm, bool hierarchical) {
        const std::string what = fmt::format("compressed_allreduce('{}')", name);
        const TensorView view = to_view(tensor, what, stream);
        const OwnedSegments owned(segments, view.numel(), what);
        AllreduceOptions options;
        options.op = op_of(op);
        options.step = step;
        options.algorithm = parse_algorithm(algorithm);
        options.segments = owned.view();
        options.hierarchical = hierarchical;
        AllreduceStats stats;
        {
          nb::gil_scoped_release release;
          stats = compressed_allreduce(comm, compressor, view, name, options);
        }
        nb::dict d;
        fill_stats(d, stats);
        return d;
      },
      "comm"_a, "compressor"_a, "tensor"_a, "name"_a, "op"_a = "average", "step"_a = 0, "stream"_a = 0,
      "segments"_a = nb::none(), "algorithm"_a = "auto", "hierarchical"_a = false,
      "In place: the average (or sum) over ranks of what each rank's compressor sent. segments: None or "
      "[(name, offset, numel[, rows])], the named tensors the tensor is made of (error feedback per name; rows: a "
      "matrix's first dimension, for powersgd). hierarchical: "
      "dense sum inside each node (comm.node_color(), GRADCOMP_LOCAL_SIZE), compressed between node leaders (node "
      "groups built for this call). Returns the AllreduceStats as a dict.");
  m.attr("has_runtime") = true;
  nb::class_<Runtime>(m, "Runtime", "The fusion runtime over one communicator (background thread).")
      .def(
          "__init__",
          [](Runtime* self, Communicator& comm, std::string_view default_spec, std::string_view op,
             double cycle_time_ms, long long fusion_threshold_bytes, std::string timeline_path, double timeout_s,
             Communicator* device_comm) {
            RuntimeOptions options;
            options.device_comm = device_comm;
            options.policy.default_spec = std::string(default_spec);
            options.op = op_of(op);
            if (cycle_time_ms > 0) options.cycle_time_ms = cycle_time_ms;
            if (fusion_threshold_bytes >= 0) {
              options.fusion_threshold_bytes = static_cast<std::size_t>(fusion_threshold_bytes);
            }
            if (!timeline_path.empty()) options.timeline_path = std::move(timeline_path);
            if (timeout_s > 0) options.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
            new (self) Runtime(comm, options);
          },
          "comm"_a, "default_spec"_a = "none", "op"_a = "average", "cycle_time_ms"_a = 0.0,
          "fusion_threshold_bytes"_a = -1, "timeline_path"_a = "", "timeout_s"_a = 0.0,
          "device_comm"_a = nb::none(), nb::keep_alive<1, 2>(), nb::keep_alive<1, 9>(),
          "device_comm: communicator for the data of CUDA tensors (e.g. make_nccl_communicator(world, local_rank));\n"
          "None: CUDA tensors use `comm` (staged through host memory once per fused buffer).")
      .def(
          "allreduce_async",
          [](Runtime& r, std::string_view name, const OutArray& tensor, std::string_view spec, std::uintptr_t stream,
             std::optional<std::string_view> op, Compressor* compressor, std::string_view scope,
             std::optional<std::uint64_t> step) {
            const TensorView view = to_view(tensor, fmt::format("allreduce_async('{}')", name), stream);
            SubmitOptions submit;
            submit.spec = spec;
            if (op) submit.op = op_of(*op);
            submit.compressor = compressor;
            submit.scope = scope;
            submit.step = step;
            nb::gil_scoped_release release;
            return r.allreduce_async(name, view, submit).id;
          },
          "name"_a, "tensor"_a, "spec"_a = "", "stream"_a = 0, "op"_a = nb::none(), "compressor"_a = nb::none(),
          "scope"_a = "", "step"_a = nb::none(),
          "Enqueues an in-place allreduce; returns a handle id for wait(). Keep the tensor alive until then.\n"
          "For a CUDA tensor, `stream` is the cudaStream_t that produced it\n"
          "(torch.cuda.current_stream().cuda_stream).\n"
          "op: \"sum\" or \"average\" for this tensor; None = the runtime's op (its constructor's). Only tensors\n"
          "of the same op are fused together.\n"
          "compressor + scope: the caller's own codec instance (its state is the caller's) and namespace (names are\n"
          "unique and negotiated per scope; one compressor per scope). step: the tensor's step for its codec.")
      .def(
          "wait",
          [](Runtime& r, std::uint64_t id) {
            nb::gil_scoped_release release;
            r.wait(Handle{id});
          },
          "handle"_a)
      // Every call that may wait on the runtime's locks releases the GIL: the runtime's threads take it to run
      // Python codecs (python/src/python_codec.h).
      .def("poll", [](const Runtime& r, std::uint64_t id) { return r.poll(Handle{id}); }, "handle"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("synchronize",
           [](Runtime& r) {
             nb::gil_scoped_release release;
             r.synchronize();
           })
      .def(
          "join",
          [](Runtime& r) {
            nb::gil_scoped_release release;
            return r.join();
          },
          "Horovod's join: serves the other ranks' tensors with zeros until every rank joined; returns the rank that "
          "joined last (Runtime::join).")
      .def("shutdown",
           [](Runtime& r) {
             nb::gil_scoped_release release;
             r.shutdown();
           })
      .def("start_timeline", &Runtime::start_timeline, "path"_a,
           "Writes the Chrome-trace timeline to `path` ({rank} replaced; without it only rank 0 writes) from now on.")
      .def("stop_timeline", &Runtime::stop_timeline, "Closes the timeline file (valid JSON).")
      .def("residual", &Runtime::residual, "name"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "save_state",
          [](const Runtime& r) {
            std::vector<std::byte> state;
            {
              nb::gil_scoped_release release;
              state = r.save_state();
            }
            return nb::bytes(reinterpret_cast<const char*>(state.data()), state.size());
          },
          "This rank's compression state (residuals, codec states, step counters) as bytes; only when no work is "
          "pending (after synchronize()).")
      .def(
          "load_state",
          [](Runtime& r, nb::bytes state) {
            const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(state.c_str()), state.size());
            nb::gil_scoped_release release;
            r.load_state(bytes);
          },
          "state"_a, "Restores a state from save_state() of the same rank (same options and world size).")
      .def("stats",
           [](const Runtime& r) {
             RuntimeStats s;
             {
               nb::gil_scoped_release release;
               s = r.stats();
             }
             nb::dict d;
             d["cycles"] = s.cycles;
             d["busy_cycles"] = s.busy_cycles;
             d["negotiation_collectives"] = s.negotiation_collectives;
             d["negotiation_bytes"] = s.negotiation_bytes;
             d["copy_bytes"] = s.copy_bytes;
             d["alone_bytes"] = s.alone_bytes;
             d["gathered_bytes"] = s.gathered_bytes;
             d["tensors"] = s.tensors;
             d["messages"] = s.messages;
             d["input_bytes"] = s.input_bytes;
             d["wire_bytes"] = s.wire_bytes;
             d["staged_bytes"] = s.staged_bytes;
             d["allocations"] = s.allocations;
             d["compression_ratio"] = s.compression_ratio();
             d["compress_s"] = s.compress_s;
             d["communicate_s"] = s.communicate_s;
             d["decompress_s"] = s.decompress_s;
             return d;
           })
      .def_prop_ro("rank", &Runtime::rank)
      .def_prop_ro("size", &Runtime::size);
}

}  // namespace gradcomp::python
