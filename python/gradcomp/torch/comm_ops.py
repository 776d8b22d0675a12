"""The Python collectives of gradcomp.torch, written once against a C++ Communicator (``comm.rank``, ``comm.size`` and
its calls), whichever backend built it (backends.py): allreduce (sum, average, min, max, product of any dtype),
allgather of equal shapes, allgatherv along the first dimension, alltoallv, broadcast, barrier. Horovod's functions
(collectives.py, gathers.py, objects.py), process sets, Adasum, sparse gradients and join's control rounds use them.

Tensors may live on any device: the Communicator's byte calls take host memory, so a tensor that lives elsewhere
travels through a host copy and the result comes back on its device. A float32 sum or average is the Communicator's
own allreduce; every other dtype and op is reduced here in rank order (exact and deterministic on every backend; half
precision accumulates in float32 and rounds once): by a reduce-scatter and an allgather (an alltoall of n chunks, each
rank reduces its chunk over the ranks in rank order, an allgather of the reduced chunks: 2(n-1)/n of the tensor's bytes
leave each rank, as in a ring allreduce), or, when all ranks' copies together fit GATHER_MAX_BYTES, from one allgather
(one round instead of two, for latency-bound sizes). Failures raise HorovodInternalError (errors.py)."""
import functools

import torch

from .._compressors import InvalidArgument
from .errors import _internal_errors

HOST = torch.device("cpu")
_NATIVE_OPS = ("sum", "average")  # what the Communicator's allreduce takes from Python (float32)
_HALF = (torch.float16, torch.bfloat16)
GATHER_MAX_BYTES = 4096  # a tensor whose n copies fit this is reduced from one allgather


def transport_device():
    """Where the Communicator's calls take tensors: the host."""
    return HOST


def _staged(fn):
    """fn(t, ...) on a host copy of `t`; tensor results (alone or first of a tuple) moved back to t's device."""
    @functools.wraps(fn)
    def run(t, *args, **kwargs):
        if t.device == HOST:
            return fn(t, *args, **kwargs)
        out = fn(t.detach().to(HOST), *args, **kwargs)
        if isinstance(out, tuple):
            return (out[0].to(t.device),) + out[1:]
        return out.to(t.device)
    return run


def as_bytes(t):
    """The bytes of a contiguous tensor, as the Communicator's byte calls take them (an empty one when t is)."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


@_staged
def allreduce(t, op, comm):
    """op over the communicator's ranks of `t` (sum, average, min, max, product), any dtype (average: floating point
    only); a new tensor, the same bits on every rank."""
    t = t.detach().contiguous()
    if t.dtype == torch.float32 and op in _NATIVE_OPS:
        out = t.clone()
        if out.numel():
            with _internal_errors():
                comm.allreduce(out.view(-1), op)
        return out
    if op == "average" and not t.is_floating_point():
        raise InvalidArgument(f"allreduce: op 'average' takes floating-point tensors, got {t.dtype}")
    if t.numel() == 0:
        return t.clone()
    if comm.size * t.numel() * t.element_size() <= GATHER_MAX_BYTES:
        return _in_rank_order(allgather_fixed(t, comm).view(comm.size, -1), op).view(t.shape)
    return _reduce_scatter_allgather(t, op, comm)


def _reduce_scatter_allgather(t, op, comm):
    """allreduce's bandwidth-bound path: rank d reduces chunk d of every rank's `t` in rank order, then every rank
    gathers the reduced chunks (the last chunk padded)."""
    n, flat = comm.size, t.reshape(-1)
    m = -(-flat.numel() // n)
    padded = flat if flat.numel() == n * m else torch.cat([flat, flat.new_zeros(n * m - flat.numel())])
    chunks = torch.empty(n * m, dtype=t.dtype)  # chunk `comm.rank` of every rank, in rank order
    out = torch.empty(n * m, dtype=t.dtype)
    counts = [m * t.element_size()] * n
    with _internal_errors():
        comm.alltoallv(as_bytes(padded), counts, as_bytes(chunks), counts)
        comm.allgather(as_bytes(_in_rank_order(chunks.view(n, m), op)), as_bytes(out))
    return out[:flat.numel()].view(t.shape)


def _in_rank_order(parts, op):
    """op over the rows of `parts` (one per rank), row 0 first; half types accumulate in float32 and round once; an
    average divides the sum by the row count before that rounding."""
    dtype = parts.dtype
    acc = parts[0].float() if dtype in _HALF else parts[0].clone()
    for part in parts[1:]:
        part = part.float() if dtype in _HALF else part
        if op in ("sum", "average"):
            acc += part
        elif op == "product":
            acc *= part
        elif op == "min":
            acc = torch.minimum(acc, part)
        else:
            acc = torch.maximum(acc, part)
    if op == "average":
        acc /= parts.shape[0]
    return acc.to(dtype)


@_staged
def allgather_fixed(t, comm):
    """(size, *t.shape): every rank's `t` (same shape on every rank) in rank order."""
    t = t.detach().contiguous()
    out = torch.empty((comm.size,) + tuple(t.shape), dtype=t.dtype)
    if t.numel():
        with _internal_errors():
            comm.allgather(as_bytes(t), as_bytes(out))
    return out


def _shape_descriptor(t):
    if t.dim() > 8:
        raise InvalidArgument(f"allgather: tensors of at most 8 dimensions, got {t.dim()}")
    d = torch.full((10,), -1, dtype=torch.int64)
    d[0] = t.dim()
    d[1] = t.element_size()
    d[2:2 + t.dim()] = torch.tensor(list(t.shape), dtype=torch.int64)
    return d


@_staged
def allgatherv(t, comm, what="allgather"):
    """Concatenation along the first dimension of every rank's `t` (first dimensions may differ; the others and the
    element size must agree: InvalidArgument on every rank otherwise). Returns (tensor, first dimensions in rank
    order)."""
    t = t.detach().contiguous()
    if t.dim() == 0:
        t = t.view(1)
    desc = allgather_fixed(_shape_descriptor(t), comm)
    if not bool((desc[:, 0] == desc[0, 0]).all()) or not bool((desc[:, 3:] == desc[0, 3:]).all()) \
            or not bool((desc[:, 1] == desc[0, 1]).all()):
        raise InvalidArgument(f"{what}: ranks disagree on dtype or on dimensions after the first: "
                              f"{[tuple(int(x) for x in r[2:2 + int(r[0])]) for r in desc]}")
    dims = [int(x) for x in desc[:, 2]]
    tail = tuple(t.shape[1:])
    out = torch.empty((sum(dims),) + tail, dtype=t.dtype)
    if out.numel():
        row_bytes = torch.Size(tail).numel() * t.element_size()
        with _internal_errors():
            comm.allgatherv(as_bytes(t), [d * row_bytes for d in dims], as_bytes(out))
    return out, dims


@_staged
def alltoallv(t, splits, comm):
    """Rows splits[d] of `t` (in order) to rank d; returns (received rows in rank order, received splits)."""
    t = t.detach().contiguous()
    splits = [int(s) for s in splits]
    rows = t.shape[0] if t.dim() else 1
    if len(splits) != comm.size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise InvalidArgument(f"alltoall: splits {splits} must have {comm.size} non-negative entries summing to the "
                              f"first dimension {rows}")
    matrix = allgather_fixed(torch.tensor(splits, dtype=torch.int64), comm)
    recv = [int(x) for x in matrix[:, comm.rank]]
    tail = tuple(t.shape[1:])
    out = torch.empty((sum(recv),) + tail, dtype=t.dtype)
    row_bytes = t.element_size() * (torch.Size(tail).numel() if t.dim() else 1)
    with _internal_errors():
        comm.alltoallv(as_bytes(t), [s * row_bytes for s in splits], as_bytes(out), [r * row_bytes for r in recv])
    return out, recv


def broadcast_(t, root, comm):
    """In place: `t` (any device, any layout) becomes the one of rank `root` of the communicator; returns t."""
    if t.device != HOST or not t.is_contiguous():
        work = t.detach().to(HOST).contiguous()
        broadcast_(work, root, comm)
        t.detach().copy_(work)
        return t
    if t.numel():
        with _internal_errors():
            comm.broadcast(as_bytes(t.detach()), root)
    return t


def barrier(comm):
    with _internal_errors():
        comm.barrier()
