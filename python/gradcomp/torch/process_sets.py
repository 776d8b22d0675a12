"""Process sets (Horovod's ``ProcessSet``, ``global_process_set``, ``add_process_set``, ``remove_process_set``) and
the collectives of gradcomp.torch's Python API over one of them: allreduce (sum, min, max, product of any dtype),
allgather (fixed and variable first dimension), alltoallv, broadcast, barrier.

A process set is a subset of the world's ranks with its own communicator: on the "mpi" and "runtime" backends a C++
``Communicator.split`` of the world communicator, on the "torch" backend a ``torch.distributed.new_group``. Creating
and removing one is collective over the whole world (every rank calls add_process_set with the same ranks, in the
same order, as in Horovod). What other modules use (e.g. DistributedOptimizer(process_set=...)):

- ``ps.ranks`` (global ranks, sorted), ``ps.size()``, ``ps.rank()`` (rank inside the set), ``ps.included()``;
- ``ps.communicator()``: the set's C++ Communicator on the mpi/runtime backends (pass it to
  ``_C.compressed_allreduce``; the global set's is the world communicator ``_ctx.comm``); None on the torch backend;
- ``ps.torch_group()``: the set's torch.distributed group on the torch backend (None for the global set = WORLD);
- ``_resolve(ps)``: the set, checked (initialized, this rank a member), global_process_set for None.
The fusion runtime runs on the world only: a process set's tensors on the runtime backend go through its communicator.
"""
import functools

import torch
import torch.distributed as dist

from .._compressors import InvalidArgument
from .context import _ctx, _require_init
from .errors import _internal_errors
from .lifetimes import keep_for_torch


class ProcessSet:
    """A subset of ranks (global ranks) that run collectives together; register it with add_process_set()."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks):
        ranks = sorted(int(r) for r in ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet: duplicate ranks in {ranks}")
        self.ranks = ranks
        self._comm = None
        self._group = None

    def _invalidate(self):
        self.process_set_id = None
        self._comm = None
        self._group = None

    def size(self):
        """The number of ranks in the set, None if it is not registered."""
        if self.process_set_id is None:
            return None
        return len(_ranks_of(self))

    def rank(self):
        """This process's rank inside the set (None if not registered; -1... raises if not a member)."""
        if self.process_set_id is None:
            return None
        ranks = _ranks_of(self)
        return ranks.index(_ctx.rank) if _ctx.rank in ranks else None

    def included(self):
        if self.ranks is None and self is not global_process_set:
            return None
        return _ctx.rank in _ranks_of(self)

    def communicator(self):
        return _ctx.comm if self is global_process_set else self._comm

    def torch_group(self):
        return None if self is global_process_set else self._group

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id \
            and self.process_set_id is not None

    def __hash__(self):
        return hash(self.process_set_id)

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={_ranks_of(self)})"

    __repr__ = __str__


def _ranks_of(ps):
    if ps is global_process_set:
        return list(range(_ctx.size))
    return ps.ranks


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_registry = {}   # id -> ProcessSet (the global set is not in it)
_next_id = [1]


def _reset():
    """shutdown(): every added set becomes invalid (init() starts with the global set only, as in Horovod)."""
    for ps in _registry.values():
        ps._invalidate()
    _registry.clear()
    _next_id[0] = 1


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of global ranks) and returns it. Collective over all ranks."""
    _require_init()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = process_set.ranks
    if not ranks or any(r < 0 or r >= _ctx.size for r in ranks):
        raise ValueError(f"add_process_set: ranks {ranks} must be a non-empty subset of 0..{_ctx.size - 1}")
    if ranks == list(range(_ctx.size)) or any(p.ranks == ranks for p in _registry.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    member = _ctx.rank in ranks
    with _internal_errors():
        if _ctx.backend in ("mpi", "runtime"):
            comm = _ctx.comm.split(0 if member else 1, _ctx.rank)
            process_set._comm = comm if member else None
        else:
            group = dist.new_group(ranks)
            process_set._group = group if member else None
    process_set.process_set_id = _next_id[0]
    _next_id[0] += 1
    _registry[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregisters an added set (collective); False for the global set or one not registered."""
    if process_set is None or process_set.process_set_id in (None, 0) \
            or _registry.get(process_set.process_set_id) is not process_set:
        return False
    barrier_world()
    del _registry[process_set.process_set_id]
    process_set._invalidate()
    return True


def _resolve(ps):
    _require_init()
    if ps is None or ps is global_process_set:
        return global_process_set
    if not isinstance(ps, ProcessSet) or ps.process_set_id is None:
        raise ValueError(f"process_set {ps} is not registered: add it with add_process_set()")
    if _ctx.rank not in ps.ranks:
        raise ValueError(f"rank {_ctx.rank} is not a member of {ps}")
    return ps


# ---- collectives over a resolved set ----
# Each takes tensors on any device: they travel on the transport's device (the host for the C++ communicators and
# gloo, the current CUDA device for an NCCL process group), staged there when they live elsewhere, and the results
# come back on the input's device.

def transport_device():
    """Where the Python collectives' transport wants tensors: CUDA for the torch backend on NCCL, else the host."""
    if _ctx.backend == "torch" and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _staged(fn):
    """fn(t, ...) on `t` moved to the transport's device; tensor results (alone or first of a tuple) moved back."""
    @functools.wraps(fn)
    def run(t, *args, **kwargs):
        dev = transport_device()
        if t.device == dev:
            return fn(t, *args, **kwargs)
        out = fn(t.detach().to(dev), *args, **kwargs)
        if isinstance(out, tuple):
            return (out[0].to(t.device),) + out[1:]
        return out.to(t.device)
    return run


_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
              "product": dist.ReduceOp.PRODUCT}


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def _torch_safe(t):
    """gloo cannot reduce bool, bfloat16 (and sums float16 element by element): widen, then narrow back."""
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.float()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t


@_staged
def allreduce(t, op, ps):
    """op over the set of `t` (sum, min, max, product), any dtype. Floats other than float32 and other ops than a
    float32 sum are reduced locally in rank order from an allgather on the C++ communicators (exact, deterministic)."""
    t = t.detach().contiguous()
    size = len(_ranks_of(ps))
    with _internal_errors():
        if _ctx.backend == "torch":
            work = _torch_safe(t).clone()
            dist.all_reduce(work, op=_TORCH_OPS[op], group=ps.torch_group())
            keep_for_torch(work)
            return work.to(t.dtype)
        if t.dtype == torch.float32 and op == "sum":
            out = t.clone()
            if out.numel():
                ps.communicator().allreduce(out.view(-1), "sum")
            return out
    parts = allgather_fixed(t, ps)
    acc = parts[0].clone()
    for i in range(1, size):
        if op == "sum":
            acc += parts[i]
        elif op == "product":
            acc *= parts[i]
        elif op == "min":
            acc = torch.minimum(acc, parts[i])
        else:
            acc = torch.maximum(acc, parts[i])
    return acc


@_staged
def allgather_fixed(t, ps):
    """(size, *t.shape): every rank's `t` (same shape on every rank) in set-rank order."""
    t = t.detach().contiguous()
    size = len(_ranks_of(ps))
    with _internal_errors():
        if _ctx.backend == "torch":
            src = _torch_safe(t)
            out = [torch.empty_like(src) for _ in range(size)]
            dist.all_gather(out, src, group=ps.torch_group())
            keep_for_torch(out, src)
            return torch.stack(out).to(t.dtype)
        out = torch.empty((size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
        if t.numel():
            ps.communicator().allgather(_bytes(t), _bytes(out))
        return out


def _shape_descriptor(t):
    if t.dim() > 8:
        raise InvalidArgument(f"allgather: tensors of at most 8 dimensions, got {t.dim()}")
    d = torch.full((10,), -1, dtype=torch.int64)
    d[0] = t.dim()
    d[1] = int(t.dtype.itemsize if hasattr(t.dtype, "itemsize") else t.element_size())
    d[2:2 + t.dim()] = torch.tensor(list(t.shape), dtype=torch.int64)
    return d


@_staged
def allgatherv(t, ps, what="allgather"):
    """Concatenation along the first dimension of every rank's `t` (first dimensions may differ; the others must
    agree: InvalidArgument on every rank otherwise). Returns (tensor, first dimensions in set-rank order)."""
    t = t.detach().contiguous()
    if t.dim() == 0:
        t = t.view(1)
    desc = allgather_fixed(_shape_descriptor(t), ps)
    if not bool((desc[:, 0] == desc[0, 0]).all()) or not bool((desc[:, 3:] == desc[0, 3:]).all()) \
            or not bool((desc[:, 1] == desc[0, 1]).all()):
        raise InvalidArgument(f"{what}: ranks disagree on dtype or on dimensions after the first: "
                              f"{[tuple(int(x) for x in r[2:2 + int(r[0])]) for r in desc]}")
    dims = [int(x) for x in desc[:, 2]]
    tail = tuple(t.shape[1:])
    row = 1
    for s in tail:
        row *= s
    out = torch.empty((sum(dims),) + tail, dtype=t.dtype, device=t.device)
    with _internal_errors():
        if _ctx.backend == "torch":
            longest = max(dims)
            src = _torch_safe(t)
            padded = torch.zeros((longest,) + tail, dtype=src.dtype, device=src.device)
            padded[:t.shape[0]] = src
            parts = [torch.empty_like(padded) for _ in dims]
            dist.all_gather(parts, padded, group=ps.torch_group())
            keep_for_torch(parts, padded)
            torch.cat([p[:d] for p, d in zip(parts, dims)], out=out) if len(parts) else None
            return out, dims
        if out.numel():
            counts = [d * row * t.element_size() for d in dims]
            send = _bytes(t) if t.numel() else torch.empty(0, dtype=torch.uint8)
            ps.communicator().allgatherv(send, counts, _bytes(out))
    return out, dims


@_staged
def alltoallv(t, splits, ps):
    """Rows splits[d] of `t` (in order) to set rank d; returns (received rows in set-rank order, received splits)."""
    t = t.detach().contiguous()
    size = len(_ranks_of(ps))
    splits = [int(s) for s in splits]
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != (t.shape[0] if t.dim() else 1):
        raise InvalidArgument(f"alltoall: splits {splits} must have {size} non-negative entries summing to the first "
                              f"dimension {t.shape[0] if t.dim() else 1}")
    matrix = allgather_fixed(torch.tensor(splits, dtype=torch.int64), ps)
    me = ps.rank() if ps is not global_process_set else _ctx.rank
    recv = [int(x) for x in matrix[:, me]]
    tail = tuple(t.shape[1:])
    row = t[0].numel() if t.dim() and t.shape[0] else int(torch.tensor(tail).prod()) if tail else 1
    out = torch.empty((sum(recv),) + tail, dtype=t.dtype, device=t.device)
    with _internal_errors():
        if _ctx.backend == "torch":
            src = _torch_safe(t)
            work = torch.empty(out.shape, dtype=src.dtype, device=src.device)
            dist.all_to_all_single(work, src, output_split_sizes=recv, input_split_sizes=splits,
                                   group=ps.torch_group())
            keep_for_torch(work, src)
            out.copy_(work)
        else:
            es = t.element_size() * row
            send = _bytes(t) if t.numel() else torch.empty(0, dtype=torch.uint8)
            rbuf = _bytes(out) if out.numel() else torch.empty(0, dtype=torch.uint8)
            ps.communicator().alltoallv(send, [s * es for s in splits], rbuf, [r * es for r in recv])
    return out, recv


def broadcast_(t, root_rank, ps):
    """In place: `t` becomes global rank root_rank's (a member of the set)."""
    dev = transport_device()
    if t.device != dev:
        work = t.detach().to(dev)
        broadcast_(work, root_rank, ps)
        t.detach().copy_(work)
        return t
    ranks = _ranks_of(ps)
    if root_rank not in ranks:
        raise InvalidArgument(f"broadcast: root_rank {root_rank} is not a member of {ps}")
    with _internal_errors():
        if _ctx.backend == "torch":
            if t.dtype in (torch.bool, torch.bfloat16) or not t.is_contiguous():
                work = t.detach().contiguous().view(-1).view(torch.uint8) if t.dtype == torch.bool \
                    else t.detach().contiguous()
                work = work.clone()
                sent = work.view(-1).view(torch.uint8) if work.dtype == torch.bfloat16 else work
                dist.broadcast(sent, root_rank, group=ps.torch_group())
                keep_for_torch(sent)
                t.detach().copy_(work.view(t.dtype).view(t.shape) if t.dtype == torch.bool else work)
            else:
                sent = t.detach()
                dist.broadcast(sent, root_rank, group=ps.torch_group())
                keep_for_torch(sent)
        else:
            if not t.is_contiguous():
                raise InvalidArgument("broadcast_: tensor must be contiguous")
            if t.numel():
                ps.communicator().broadcast(_bytes(t.detach()), ranks.index(root_rank))
    return t


def barrier(ps):
    with _internal_errors():
        if _ctx.backend == "torch":
            dist.barrier(group=ps.torch_group())
        else:
            ps.communicator().barrier()


def barrier_world():
    barrier(global_process_set)
