"""Sparse gradients in DistributedOptimizer, as Horovod reduces them (sparse_allreduce_async): every rank's indices
and values of a COO gradient (``Embedding(sparse=True)``) are allgathered in rank order; the result is the sparse
tensor of all of them (duplicate indices add up when the optimizer applies it), values divided by the size for
Average. Compression does not apply (as in Horovod). The allgathers are gathers.sparse_allreduce_async's."""
from .context import Average, Sum
from .gathers import sparse_allreduce_async


def allgather_sparse_grad(p, op):
    """Replaces p.grad (sparse COO) by the gather of every rank's (Horovod's sparse allreduce), in place."""
    grad = p.grad
    out = gather_sparse(grad, op)
    p.grad.zero_().add_(out.to(device=grad.device, dtype=grad.dtype))


def gather_sparse(grad, op):
    """Every rank's entries of the sparse COO `grad` (a joined rank passes one with none), values / size for
    Average."""
    t = grad.coalesce() if not grad.is_coalesced() else grad
    return sparse_allreduce_async(t, "sparse gradient", Average if op == Average else Sum)()
