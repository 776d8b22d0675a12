"""Horovod's allreduce family over gradcomp's communicators: allreduce(_)(_async)(_), grouped_allreduce*, the ops
Average, Sum, Min, Max, Product (Adasum: adasum.py), prescale/postscale factors, process sets, any dtype (an Average
of integers is the sum times postscale/size, truncated toward zero, as Horovod's ScaleBuffer does it); handles,
poll(), synchronize(), join() and barrier().

Collectives run when called: an async call returns a handle whose result is ready (poll() is True); the handle
table and synchronize() are Horovod's. allreduce is an autograd Function (the gradient of an allreduce is the same
allreduce of the gradient, as in Horovod).

join(): a joined rank serves the others' global-set allreduces and DistributedOptimizer steps with zeros (an Average
still divides by the world size, as in Horovod) until every rank has joined; it learns each operation from notes the
others send it only once it has joined (join_notes.py), so join costs nothing while no rank is joined. join() returns
the rank that joined last (of several joining at the same point, the highest)."""
import contextlib
import itertools

import torch

from .._compressors import Compression, CompressionSpec, InvalidArgument, compressor
from .._gradcomp import CommError
from .backends import _exchange_view, current as _backend
from .context import Adasum, Average, Max, Min, Product, Sum, _ctx, _require_init
from .errors import _internal_errors
from .process_sets import _ranks_of, _resolve, global_process_set
from . import join_protocol as _join
from . import comm_ops as _ops

_OPS = (Average, Sum, Min, Max, Product, Adasum)
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int16,
           torch.int8, torch.uint8, torch.bool]


def _check_reduce_op(op, average=None):
    if average is not None:
        if op is not None:
            raise ValueError("op and average cannot both be given")
        op = Average if average else Sum
    if op is None:
        op = Average
    if op not in _OPS:
        raise InvalidArgument(f"gradcomp.torch: unknown reduce op '{op}' (valid: Average, Sum, Min, Max, Product, "
                              "Adasum)")
    return op


def _scale(t, factor):
    if factor == 1.0:
        return t
    if t.dtype in (torch.float16, torch.bfloat16):
        return (t.float() * factor).to(t.dtype)
    return (t.double() * factor).to(t.dtype)  # integers: truncated toward zero, as a C++ cast of the double


# ---- handles ----
_handles = {}
_next_handle = itertools.count(1)


def _new_handle(result):
    h = next(_next_handle)
    _handles[h] = result
    return h


def poll(handle):
    """True when the operation of `handle` has completed (collectives run when called: always True for a live one)."""
    return handle in _handles or callable(handle)


def synchronize(handle):
    """The result of an async operation (its output tensor, or a tuple); None for an unknown handle, as Horovod."""
    if callable(handle):
        return handle()
    if handle not in _handles:
        return None
    return _handles.pop(handle)


# ---- join ----
def _agree(t, op, name):
    """The control round of a global-set allreduce: the ranks agree on what they reduce (join_protocol)."""
    row = [_join.ALLREDUCE, _DTYPES.index(t.dtype), t.numel(), _OPS.index(op), 0]
    _join.check_agreement(_join.control(row), f"an allreduce of '{name or 'allreduce'}' "
                                              f"({str(t.dtype).replace('torch.', '')}[{t.numel()}], op {op})")


def _agree_compressed(t, c, op, name):
    dtype = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else len(_DTYPES)
    _join.check_agreement(_join.control([_join.COMPRESSED, dtype, t.numel(), _OPS.index(op), 0]),
                          f"a compressed allreduce of '{name}' ({str(t.dtype).replace('torch.', '')}[{t.numel()}], "
                          f"'{c.spec}', op {op})")


def _replay(note):
    """On a joined rank: take part with zeros in the operation of an OP note (join_notes.py)."""
    kind = note["k"]
    if kind in ("grad", "sparse"):
        _join.replay_step(note)
        return
    _join.check_agreement(_join.control([_join.JOINED, 0, 0, 0, 0]), "join()")
    if note["dtype"] >= len(_DTYPES):
        raise InvalidArgument(f"join() on rank {_ctx.rank} of {_ctx.size}: the other ranks reduce "
                              f"'{note.get('name', 'allreduce')}' in a dtype join() cannot serve")
    dtype, op = _DTYPES[note["dtype"]], _OPS[note["op"]]
    if kind == "allreduce":
        _reduce(torch.zeros(note["numel"], dtype=dtype), op, 1.0, 1.0, global_process_set)
        return
    c = compressor(note["spec"])
    zeros = torch.zeros(note["shape"], dtype=dtype)
    with _internal_errors():
        _backend().allreduce(c, note["name"], _exchange_view(zeros, c), 0, op).wait()


def join(device=-1):
    """This rank has no more data: serve the other ranks' allreduces and optimizer steps with zeros until every rank
    has joined; returns the rank that joined last."""
    _require_init()
    if _ctx.size == 1:
        return 0
    if _ctx.notes is None:
        raise CommError(f"gradcomp.torch join() on rank {_ctx.rank} of {_ctx.size}: unavailable on this backend: "
                        f"{_ctx.notes_missing}")
    runtime_join = _join.RuntimeJoin()  # runtime backend: the optimizers' steps, negotiated by the fusion runtime
    last = _ctx.notes.join(_replay, idle_check=runtime_join.check)
    runtime_join.wait()
    return last


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has reached it."""
    _ops.barrier(_resolve(process_set).communicator())


# ---- allreduce ----
def _reduce(t, op, prescale, postscale, ps):
    """op over the set of a contiguous tensor, scaled as Horovod scales: prescale before, postscale (/ size for an
    Average) after."""
    size, comm = len(_ranks_of(ps)), ps.communicator()
    if op == Average and t.dtype == torch.float32 and prescale == 1.0 and postscale == 1.0:
        return _ops.allreduce(t, "average", comm)
    out = _ops.allreduce(_scale(t, prescale), "sum" if op == Average else op, comm)
    if op == Average:
        if out.is_floating_point():
            out = out.div_(size) if postscale == 1.0 else _scale(out.div_(size), postscale)
        else:
            out = _scale(out, postscale / size)
    else:
        out = _scale(out, postscale)
    return out


def _allreduce_impl(tensor, op, prescale, postscale, process_set, name=None):
    ps = _resolve(process_set)
    t = tensor.detach().contiguous()
    home, dev = t.device, _ops.transport_device()
    if home != dev:  # staged once through the host, where the Communicator takes tensors (comm_ops.py)
        return _allreduce_impl(t.to(dev), op, prescale, postscale, process_set, name).to(home)
    if op == Adasum:
        try:
            from .adasum import adasum_allreduce_
        except ImportError as e:
            raise InvalidArgument("allreduce(op=Adasum): gradcomp.torch.adasum is not available in this build") from e
        out = _scale(t.clone(), prescale)
        adasum_allreduce_(out, process_set=None if ps is global_process_set else ps)
        return _scale(out, postscale)
    if ps is global_process_set:
        if _runtime_takes(t, op):
            return _runtime_reduce([t], op, prescale, postscale, [name or f"allreduce.{t.numel()}"])[0]
        if _ctx.size > 1:
            with _join.served({"k": "allreduce", "dtype": _DTYPES.index(t.dtype), "numel": t.numel(),
                               "op": _OPS.index(op)}):
                _agree(t, op, name)
                return _reduce(t, op, prescale, postscale, ps)
    return _reduce(t, op, prescale, postscale, ps)


def _runtime_takes(t, op):
    """Whether a global-set allreduce goes through the fusion runtime (runtime backend; float32 Average or Sum), as
    Horovod sends every allreduce through its background thread: the runtime's negotiation checks the ranks agree
    and carries join()'s flag, so it needs no control round."""
    return _ctx.size > 1 and _ctx.runtime is not None and op in (Average, Sum) and t.dtype == torch.float32


def _runtime_reduce(tensors, op, prescale, postscale, names):
    """The reductions of `tensors` (each one _runtime_takes) through the runtime, submitted together and waited for
    together: one negotiation, fused, one cycle's latency."""
    outs = [_scale(t.clone(), prescale) for t in tensors]
    c = compressor("none")
    with _internal_errors():
        handles = [_backend().allreduce(c, name, _exchange_view(out, c), 0, op) for name, out in zip(names, outs)]
        for handle in handles:
            handle.wait()
    return [_scale(out, postscale) for out in outs]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, process_set, name):
        ctx.args = (op, prescale, postscale, process_set)
        return _allreduce_impl(tensor, op, prescale, postscale, process_set, name)

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return allreduce(grad, op=op, prescale_factor=prescale, postscale_factor=postscale,
                         process_set=process_set), None, None, None, None, None


def _is_horovod_codec(compression):
    return compression is not None and not isinstance(compression, (str, CompressionSpec)) \
        and hasattr(compression, "compress") and hasattr(compression, "decompress") \
        and not hasattr(compression, "spec")


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """The op (default Average) over the process set's ranks of `tensor` (not modified), differentiable.
    compression: a Horovod-style class (compress(t) -> (t, ctx), decompress(t, ctx)), or a gradcomp codec spec
    (reduced by the C++ compressed allreduce of init()'s backend; Average or Sum, global set)."""
    _require_init()
    op = _check_reduce_op(op, average)
    if _is_horovod_codec(compression):
        payload, cctx = compression.compress(tensor)
        return compression.decompress(
            _Allreduce.apply(payload, op, prescale_factor, postscale_factor, process_set, name), cctx)
    if compression is not None and compression != Compression.none and compression != "none":
        if op not in (Average, Sum) or process_set not in (None, global_process_set):
            raise InvalidArgument("allreduce(compression=...): a gradcomp codec reduces with Average or Sum over the "
                                  "global process set")
        out = _scale(tensor.detach().clone().contiguous(), prescale_factor)
        c = compressor(compression)
        name = name or "allreduce"
        served = _ctx.size > 1 and not _backend().negotiates(c)
        dtype = _DTYPES.index(out.dtype) if out.dtype in _DTYPES else len(_DTYPES)
        with _join.served({"k": "compressed", "dtype": dtype, "spec": c.spec, "name": name, "shape": list(out.shape),
                           "op": _OPS.index(op)}) if served else contextlib.nullcontext():
            if served:
                _agree_compressed(out, c, op, name)
            with _internal_errors():
                _backend().allreduce(c, name, _exchange_view(out, c), 0, op).wait()
        return _scale(out, postscale_factor)
    return _Allreduce.apply(tensor, op, prescale_factor, postscale_factor, process_set, name)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    _require_init()
    op = _check_reduce_op(op, average)
    return _new_handle(_allreduce_impl(tensor, op, prescale_factor, postscale_factor, process_set, name))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In place: `tensor` becomes the reduction; returns it."""
    _require_init()
    op = _check_reduce_op(op, average)
    with torch.no_grad():
        tensor.copy_(_allreduce_impl(tensor, op, prescale_factor, postscale_factor, process_set, name))
    return tensor


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    return _new_handle(allreduce_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """allreduce of each tensor of the list (one result per tensor, differentiable)."""
    return [allreduce(t, average, None if name is None else f"{name}.{i}", compression, op, prescale_factor,
                      postscale_factor, process_set) for i, t in enumerate(tensors)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    _require_init()
    op = _check_reduce_op(op, average)
    return _new_handle(_grouped_impl(tensors, op, prescale_factor, postscale_factor, process_set, name))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """In place: each tensor becomes its reduction; returns the list."""
    _require_init()
    op = _check_reduce_op(op, average)
    with torch.no_grad():
        for t, result in zip(tensors, _grouped_impl(tensors, op, prescale_factor, postscale_factor, process_set,
                                                    name)):
            t.copy_(result)
    return list(tensors)


def _grouped_impl(tensors, op, prescale, postscale, process_set, name):
    """Each tensor's reduction; on the runtime backend, when it takes them all (on the transport device), in one
    _runtime_reduce."""
    ts = [t.detach().contiguous() for t in tensors]
    dev = _ops.transport_device()
    if len(ts) < 2 or _resolve(process_set) is not global_process_set or \
            not all(_runtime_takes(t, op) and t.device == dev for t in ts):
        return [_allreduce_impl(t, op, prescale, postscale, process_set, name) for t in ts]
    base = name or "grouped_allreduce"
    return _runtime_reduce(ts, op, prescale, postscale, [f"{base}.{i}" for i in range(len(ts))])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    return _new_handle(grouped_allreduce_(tensors, average, name, op, prescale_factor, postscale_factor,
                                          process_set))
