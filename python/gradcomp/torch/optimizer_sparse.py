"""Sparse gradients in DistributedOptimizer, as Horovod reduces them (sparse_allreduce_async): every rank's indices
and values of a COO gradient (``Embedding(sparse=True)``) are allgathered in rank order; the result is the sparse
tensor of all of them (duplicate indices add up when the optimizer applies it), values divided by the size for
Average. Compression does not apply (as in Horovod). Transport: comm_ops' allgatherv on the world's
Communicator."""
import torch

from .context import Average, _ctx
from . import comm_ops as _ops


def allgather_rows(t):
    """Every rank's `t` (same trailing shape, any first dimension) concatenated in rank order along dimension 0."""
    return _ops.allgatherv(t, _ctx.comm, "sparse gradient")[0]


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
