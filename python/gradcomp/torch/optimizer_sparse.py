"""Sparse gradients in DistributedOptimizer, as Horovod reduces them (sparse_allreduce_async): every rank's indices
and values of a COO gradient (``Embedding(sparse=True)``) are allgathered in rank order; the result is the sparse
tensor of all of them (duplicate indices add up when the optimizer applies it), values divided by the size for
Average. Compression does not apply (as in Horovod). Transport: the C++ Communicator's allgather/allgatherv on the
"mpi" and "runtime" backends, torch.distributed's all_gather (blocks padded to the longest) on "torch"."""
import math

import torch
import torch.distributed as dist

from .context import Average, _ctx
from .lifetimes import keep_for_torch


def _bytes(t):
    return t.reshape(-1).view(torch.uint8)


def allgather_rows(t):
    """Every rank's `t` (same trailing shape, any first dimension) concatenated in rank order along dimension 0."""
    t = t.detach().contiguous()
    rows = torch.tensor([t.shape[0]], dtype=torch.int64)
    if _ctx.backend in ("mpi", "runtime"):
        counts = torch.zeros(_ctx.size, dtype=torch.int64)
        _ctx.comm.allgather(_bytes(rows), _bytes(counts))
        row_elems = math.prod(t.shape[1:])
        total = int(counts.sum())
        out = torch.empty((total,) + tuple(t.shape[1:]), dtype=t.dtype)
        es = t.element_size() * row_elems
        if total:
            send = _bytes(t) if t.numel() else torch.empty(0, dtype=torch.uint8)
            _ctx.comm.allgatherv(send, [int(c) * es for c in counts], _bytes(out))
        return out
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(_ctx.size)]
    dist.all_gather(counts, rows)
    keep_for_torch(counts, rows)
    counts = [int(c) for c in counts]
    longest = max(counts)
    padded = torch.zeros((longest,) + tuple(t.shape[1:]), dtype=t.dtype)
    padded[:t.shape[0]].copy_(t)
    blocks = [torch.empty_like(padded) for _ in range(_ctx.size)]
    dist.all_gather(blocks, padded)
    keep_for_torch(blocks, padded)
    return torch.cat([b[:c] for b, c in zip(blocks, counts)], 0)


def allgather_sparse_grad(p, op):
    """Replaces p.grad (sparse COO) by the gather of every rank's (Horovod's sparse allreduce), in place."""
    grad = p.grad
    t = grad.coalesce() if not grad.is_coalesced() else grad
    indices = allgather_rows(t._indices().t().contiguous())  # rows: (nnz, sparse_dim)
    values = allgather_rows(t._values())
    if op == Average:
        values = values / _ctx.size
    out = torch.sparse_coo_tensor(indices.t(), values, grad.shape, dtype=grad.dtype, device=grad.device)
    p.grad.zero_().add_(out)
