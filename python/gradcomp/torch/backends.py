"""How one tensor's compressed allreduce is carried out on each backend init() can choose, as DistributedOptimizer and
allreduce(compression=...) use it: "torch" (the C++ algorithms over the process group, in its exchange worker, as
the DDP hook), "mpi" (the C++ compressed_allreduce over gradcomp's MPI communicator) or "runtime" (the C++ fusion
runtime). Each returns a handle whose wait() completes the reduction in place. `process_set` (a registered, resolved
ProcessSet other than the global one, or None for the world) reduces over that set's communicator or group.
`scope` (context.new_scope) names the owner of `comp` (an optimizer): on the runtime backend the owner's own compressor
instance and namespace are handed to the runtime, so two owners never share state, names or fusion buffers; the
other backends already run the owner's instance, whose state is keyed by the tensor names it alone submits. `stats`
(a dict, optional) receives the exchange's AllreduceStats (payload, input and wire bytes, algorithm) by the time
wait() returns, on the "mpi" and "torch" backends (the runtime reports its own RuntimeStats instead)."""
import torch

from .. import _gradcomp as _C
from . import exchange
from .context import _ctx


def _exchange_view(tensor, comp):
    """A contiguous `tensor` as the C++ codecs take it: a matrix of its first dimension's rows when it has two or
    more dimensions (shape-aware codecs such as powersgd compress that matrix), else flat. Python codecs get it
    flat."""
    if tensor.dim() >= 2 and not comp.is_python and tensor.numel() > 0:
        return tensor.view(tensor.shape[0], -1)
    return tensor.view(-1)


class _Handle:
    def __init__(self, fut=None):
        self.fut = fut

    def wait(self):
        if self.fut is not None:
            self.fut.wait()


class _Backend:
    _instance = None

    @staticmethod
    def get():
        if _Backend._instance is None or _Backend._instance.kind != _ctx.backend:
            _Backend._instance = {"mpi": _MpiBackend, "runtime": _RuntimeBackend,
                                  "torch": _TorchBackend}[_ctx.backend]()
        return _Backend._instance


def _set_comm(process_set):
    """The C++ communicator of `process_set` (None: the world's) and its size."""
    if process_set is None:
        return _ctx.comm, _ctx.size
    return process_set.communicator(), process_set.size()


class _TorchBackend(_Backend):
    kind = "torch"

    def allreduce(self, comp, name, flat, step, op, process_set=None, scope=None, stats=None):
        group = None if process_set is None else process_set.torch_group()
        return _Handle(exchange.allreduce_async(comp, flat, name, step, op=op, group=group, stats=stats))


class _RuntimeHandle:
    def __init__(self, handle, tensor, comp):
        self.handle, self.tensor, self.comp = handle, tensor, comp  # both stay alive until wait()

    def wait(self):
        _ctx.runtime.wait(self.handle)


class _RuntimeBackend(_Backend):
    kind = "runtime"

    def allreduce(self, comp, name, flat, step, op, process_set=None, scope=None, stats=None):
        if comp.is_python or process_set is not None:
            # The fusion runtime runs on the world: a process set's tensors take its own communicator.
            return _MpiBackend().allreduce(comp, name, flat, step, op, process_set)
        stream = torch.cuda.current_stream(flat.device).cuda_stream if flat.is_cuda else 0
        # The op travels with the request: the runtime sums a Sum (never an average scaled back, which loses bits)
        # and fuses only requests of the same op.
        if scope is not None:
            handle = _ctx.runtime.allreduce_async(name, flat, stream=stream, op=op, compressor=comp._impl,
                                                  scope=scope, step=step)
        else:
            handle = _ctx.runtime.allreduce_async(name, flat, comp.spec, stream, op=op)
        return _RuntimeHandle(handle, flat, comp)


class _MpiBackend(_Backend):
    kind = "mpi"

    @staticmethod
    def python_allreduce(comp, name, flat, op, process_set=None):
        comm, size = _set_comm(process_set)
        comp.allreduce(flat, [(name, 0, flat.numel())], op, size, lambda payload: comm.allreduce(payload, "sum"))
        return _Handle()

    def allreduce(self, comp, name, flat, step, op, process_set=None, scope=None, stats=None):
        if comp.is_python:
            return _MpiBackend.python_allreduce(comp, name, flat, op, process_set)
        comm, _ = _set_comm(process_set)
        result = _C.compressed_allreduce(comm, comp._impl, flat, name, op, step)
        if stats is not None:
            stats.update(result)
        return _Handle()
