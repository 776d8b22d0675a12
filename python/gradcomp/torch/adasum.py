"""Adasum (Maleki et al. 2020, "Scaling Distributed Training with Adaptive Summation") as Horovod defines it: a
reduction, not a codec. Two vectors a, b combine as

    adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b      (a coefficient is 1 where |.|^2 < 1e-8)

recursively over rank pairs: ranks (0,1), (2,3), ... first, then (01, 23), ... — Horovod's vector-halving
distance-doubling (VHDD). At level L = 1, 2, 4, ... rank r and its neighbour r ^ L split the part of the vector each
holds: the left one (r & L == 0) keeps the first half (count // 2 elements), the right one the rest; each sends the
other the half it gives up, so each now holds its half of both operands. The three dot products (a.b, |a|^2, |b|^2) of
the whole operands are the sums of the partial ones over the 2L ranks that hold them (ranks r // 2L alike): every rank
gathers all ranks' partials (one small allgather per level) and sums its block's in rank order, so the coefficients
are identical on each of those ranks. After the last level each rank holds 1/size of the result; an allgatherv puts
the vector back together. Dot products and coefficients are computed in float64; the combination in the tensor's
dtype (float16/bfloat16 in float32).

Like Horovod (CPU path), the rank count must be a power of two: any other count raises NotImplementedError naming it
(Horovod: "Running Adasum with non-power of 2 ranks is not supported yet"). One rank: the tensor is left unchanged.

Transport: the world's C++ Communicator, whichever backend built it (pairwise exchange = alltoallv with only the
neighbour's counts non-zero; comm_ops' allgather and allgatherv). Public entry: ``adasum_allreduce_(tensor, process_set=None)``; ``allreduce(op=Adasum)`` and
``DistributedOptimizer(op=Adasum)`` use it.
"""
import torch

from .._compressors import InvalidArgument
from .context import _ctx, _require_init
from .errors import _internal_errors
from . import comm_ops as _ops

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_NORM_EPS = 1e-8


def adasum_combine(a, b):
    """The pairwise Adasum of two tensors, in float64 for the dot products (the reference definition)."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot, anorm, bnorm = float(a64 @ b64), float(a64 @ a64), float(b64 @ b64)
    return _combine(a, b, dot, anorm, bnorm)


def _coeffs(dot, anorm, bnorm):
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= _NORM_EPS else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= _NORM_EPS else 1.0
    return acoeff, bcoeff


def _combine(a, b, dot, anorm, bnorm):
    acoeff, bcoeff = _coeffs(dot, anorm, bnorm)
    work = torch.float32 if a.dtype in (torch.float16, torch.bfloat16) else a.dtype
    return (a.to(work) * acoeff + b.to(work) * bcoeff).to(a.dtype)


def _segments(count, size):
    """[(offset, count)] of the part of a `count`-element vector each rank holds after the halving levels."""
    out = []
    for r in range(size):
        offset, n, level = 0, count, 1
        while level < size:
            first = n >> 1
            if r & level:
                offset, n = offset + first, n - first
            else:
                n = first
            level <<= 1
        out.append((offset, n))
    return out


def _exchange(comm, send, peer, recv):
    """`send` to rank `peer` and `recv` from it: an alltoallv whose only non-empty counts are the peer's."""
    send_counts, recv_counts = [0] * comm.size, [0] * comm.size
    send_counts[peer] = send.numel() * send.element_size()
    recv_counts[peer] = recv.numel() * recv.element_size()
    with _internal_errors():
        comm.alltoallv(_ops.as_bytes(send), send_counts, _ops.as_bytes(recv), recv_counts)


def _communicator(process_set):
    if process_set is not None and not _is_global(process_set):
        raise InvalidArgument("adasum_allreduce_: only the global process set is supported (Horovod: \"Adasum does "
                              "not support non-global process sets yet\")")
    return _ctx.comm


def _is_global(process_set):
    """The global process set, whatever object helper code represents it with (id 0 in Horovod)."""
    pid = getattr(process_set, "process_set_id", None)
    ranks = getattr(process_set, "ranks", None)
    return pid == 0 or (ranks is not None and list(ranks) == list(range(_ctx.size)))


def check_size(size):
    if size & (size - 1):
        raise NotImplementedError(f"Adasum: {size} ranks; Adasum needs a power-of-two number of ranks (as in "
                                  "Horovod: 'Running Adasum with non-power of 2 ranks is not supported yet')")


def adasum_allreduce_(tensor, process_set=None):
    """In place: every rank's `tensor` becomes the Adasum of all ranks' tensors (CPU tensors; a CUDA tensor is
    reduced through a host copy). Returns `tensor`."""
    _require_init()
    if tensor.dtype not in _FLOATS:
        raise InvalidArgument(f"adasum_allreduce_: tensor must be float32, float64, float16 or bfloat16, got "
                              f"{tensor.dtype}")
    size = _ctx.size
    check_size(size)
    if size == 1:
        return tensor
    comm = _communicator(process_set)
    rank = _ctx.rank
    with torch.no_grad():
        buf = tensor.detach().reshape(-1).to("cpu", copy=True).contiguous()
        count = buf.numel()
        offset, n, level = 0, count, 1
        while level < size:
            peer = rank ^ level
            first = n >> 1
            left = (rank & level) == 0
            if left:
                mine_off, mine_n, give_off, give_n = offset, first, offset + first, n - first
            else:
                mine_off, mine_n, give_off, give_n = offset + first, n - first, offset, first
            mine = buf[mine_off:mine_off + mine_n]
            theirs = torch.empty(mine_n, dtype=buf.dtype)
            _exchange(comm, buf[give_off:give_off + give_n].contiguous(), peer, theirs)
            # a: the left neighbour's operand, b: the right one's (the same on both ranks of a pair).
            a, b = (mine, theirs) if left else (theirs, mine)
            a64, b64 = a.double(), b.double()
            partial = torch.tensor([float(a64 @ b64), float(a64 @ a64), float(b64 @ b64)], dtype=torch.float64)
            every = _ops.allgather_fixed(partial, comm)
            block = rank // (2 * level) * (2 * level)
            dot, anorm, bnorm = (float(x) for x in every[block:block + 2 * level].sum(0))
            buf[mine_off:mine_off + mine_n] = _combine(a, b, dot, anorm, bnorm)
            offset, n = mine_off, mine_n
            level <<= 1
        segs = _segments(count, size)
        assert segs[rank] == (offset, n)
        packed, es = torch.empty(count, dtype=buf.dtype), buf.element_size()
        with _internal_errors():
            comm.allgatherv(_ops.as_bytes(buf[offset:offset + n].contiguous()), [c * es for _, c in segs],
                            _ops.as_bytes(packed))
        out = torch.empty_like(buf)
        pos = 0
        for off, c in segs:
            out[off:off + c] = packed[pos:pos + c]
            pos += c
        tensor.detach().copy_(out.view(tensor.shape))
    return tensor


def adasum_reference(tensors):
    """The recursive pairwise definition over a list of per-rank tensors (power-of-two length): what every rank's
    tensor becomes. For tests and documentation; Horovod's VHDD gives the same up to rounding."""
    check_size(len(tensors))
    level = list(tensors)
    while len(level) > 1:
        level = [adasum_combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]
