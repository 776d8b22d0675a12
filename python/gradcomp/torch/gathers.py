"""Horovod's allgather, broadcast, alltoall, reducescatter and sparse allreduce over gradcomp's communicators (any
dtype, any device, process sets), with their async and grouped variants and the gradients Horovod defines:
allgather -> the averaged gradient's own rows; broadcast -> the averaged gradient on the root, zeros elsewhere;
alltoall -> the alltoall of the gradient with the received splits; reducescatter -> allgather of the gradient
(times the set size for Sum, and the scale factors). reducescatter moves each rank's row blocks with one alltoall and
sums them locally: half the bytes of an allreduce."""
import torch

from .._compressors import Compression, InvalidArgument
from .collectives import Average, Sum, _check_reduce_op, _is_horovod_codec, _new_handle, _scale, allreduce
from .context import _ctx, _require_init
from .process_sets import _ranks_of, _resolve, global_process_set
from . import comm_ops as _ops


# ---- allgather ----
def _allgather_impl(tensor, process_set):
    ps = _resolve(process_set)
    out, dims = _ops.allgatherv(tensor, ps.communicator())
    if tensor.dim() == 0:
        out = out.view(-1)
    return out, dims


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        out, dims = _allgather_impl(tensor, process_set)
        ctx.dims, ctx.process_set, ctx.scalar = dims, process_set, tensor.dim() == 0
        return out

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        ps = _resolve(ctx.process_set)
        r = ps.rank()
        offset = sum(ctx.dims[:r])
        g = reduced.narrow(0, offset, ctx.dims[r])
        return (g.view(()) if ctx.scalar else g), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's `tensor` concatenated along the first dimension (which may differ between ranks), differentiable."""
    _require_init()
    return _Allgather.apply(tensor, name, process_set)


def allgather_async(tensor, name=None, process_set=global_process_set):
    _require_init()
    return _new_handle(_allgather_impl(tensor, process_set)[0])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return [allgather(t, name, process_set) for t in tensors]


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    _require_init()
    return _new_handle([_allgather_impl(t, process_set)[0] for t in tensors])


# ---- broadcast ----
def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place: every rank's `tensor` becomes root_rank's (root_rank: a global rank, as in Horovod)."""
    _require_init()
    ps = _resolve(process_set)
    ranks = _ranks_of(ps)
    if root_rank not in ranks:
        raise InvalidArgument(f"broadcast: root_rank {root_rank} is not a member of {ps}")
    with torch.no_grad():
        _ops.broadcast_(tensor, ranks.index(root_rank), ps.communicator())
    return tensor


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return broadcast_(tensor.detach().clone().contiguous(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        if _ctx.rank != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's `tensor` on every rank of the set (the input is not modified), differentiable."""
    _require_init()
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _require_init()
    return _new_handle(broadcast_(tensor.detach().clone().contiguous(), root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _new_handle(broadcast_(tensor, root_rank, name, process_set))


# ---- alltoall ----
def _alltoall_impl(tensor, splits, process_set):
    ps = _resolve(process_set)
    size = len(_ranks_of(ps))
    if tensor.dim() == 0:
        raise InvalidArgument("alltoall: the tensor needs at least one dimension")
    if splits is None:
        if tensor.shape[0] % size:
            raise InvalidArgument(f"alltoall: without splits the first dimension ({tensor.shape[0]}) must be a "
                                  f"multiple of the process set size ({size})")
        splits = [tensor.shape[0] // size] * size
    elif torch.is_tensor(splits):
        splits = splits.tolist()
    out, recv = _ops.alltoallv(tensor, list(splits), ps.communicator())
    return out, torch.tensor(recv, dtype=torch.int32)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, recv = _alltoall_impl(tensor, splits, process_set)
        ctx.process_set, ctx.recv = process_set, recv
        if splits is None:
            return out
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, *unused):
        g, _ = alltoall(grad, splits=ctx.recv, process_set=ctx.process_set)
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows splits[d] of `tensor` go to rank d of the set (equal parts without splits); returns the received rows in
    rank order, and with splits also the received splits (int32), as Horovod. Differentiable."""
    _require_init()
    return _Alltoall.apply(tensor, splits, name, process_set)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _require_init()
    out, recv = _alltoall_impl(tensor, splits, process_set)
    return _new_handle(out if splits is None else (out, recv))


# ---- reducescatter ----
def _owned_rows(rows, size):
    """Horovod's split of `rows` over `size` ranks: rows // size each, the first rows % size ranks one more."""
    base, extra = divmod(rows, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def _sum_owned_rows(t, ps):
    """The sum over the set of the rows this rank owns, from one alltoall of every rank's row blocks: (n-1)/n of the
    tensor leaves each rank (an allreduce then a slice moved 2(n-1)/n). Summed here in set-rank order (exact and
    deterministic), in float32 for half types, int64 for integers and bool, else in the tensor's dtype."""
    size = len(_ranks_of(ps))
    splits = _owned_rows(t.shape[0], size)
    me = ps.communicator().rank
    received, _ = _ops.alltoallv(t, splits, ps.communicator())
    blocks = received.view((size, splits[me]) + tuple(t.shape[1:]))
    if t.dtype in (torch.float16, torch.bfloat16):
        acc_dtype = torch.float32
    elif t.is_floating_point() or t.is_complex():
        acc_dtype = t.dtype
    else:
        acc_dtype = torch.int64
    acc = blocks[0].to(acc_dtype, copy=True)
    for i in range(1, size):
        acc += blocks[i].to(acc_dtype)
    return acc


def _reducescatter_impl(tensor, op, process_set, prescale, postscale):
    if op not in (Average, Sum):
        raise InvalidArgument(f"reducescatter: op must be Average or Sum, got '{op}'")
    ps = _resolve(process_set)
    size = len(_ranks_of(ps))
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        raise InvalidArgument("reducescatter: the tensor needs at least one dimension")
    home, dev = t.device, _ops.transport_device()
    if home != dev:  # staged once through the host, where the Communicator takes tensors (comm_ops.py)
        return _reducescatter_impl(t.to(dev), op, process_set, prescale, postscale).to(home)
    out = _sum_owned_rows(_scale(t, prescale), ps)
    # Scaled as allreduce scales: an Average divides by the set size; integers take (postscale / size) at once,
    # truncated toward zero, as Horovod's ScaleBuffer.
    if op == Average and out.is_floating_point():
        out = _scale(out.div_(size), postscale)
    else:
        out = _scale(out, postscale / size if op == Average else postscale)
    return out.to(t.dtype)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.args = (op, process_set, prescale, postscale)
        return _reducescatter_impl(tensor, op, process_set, prescale, postscale)

    @staticmethod
    def backward(ctx, grad):
        op, process_set, prescale, postscale = ctx.args
        grad = grad.clone()
        if op == Sum:
            grad *= len(_ranks_of(_resolve(process_set)))
        if prescale != 1.0:
            grad *= prescale
        if postscale != 1.0:
            grad *= postscale
        return allgather(grad, process_set=process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The Average (or Sum) over the set of `tensor`, scattered along the first dimension: rank r of the set gets
    rows [r*(n//size) + min(r, n%size), ...) of n//size (+1 for the first n%size ranks), as Horovod. Differentiable."""
    _require_init()
    op = _check_reduce_op(op)
    codec = _is_horovod_codec(compression)
    payload, cctx = compression.compress(tensor) if codec else (tensor, None)
    out = _Reducescatter.apply(payload, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx) if codec else out


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    _require_init()
    return _new_handle(_reducescatter_impl(tensor, _check_reduce_op(op), process_set, prescale_factor,
                                           postscale_factor))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    return [reducescatter(t, name, compression, op, process_set, prescale_factor, postscale_factor) for t in tensors]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    _require_init()
    op = _check_reduce_op(op)
    return _new_handle([_reducescatter_impl(t, op, process_set, prescale_factor, postscale_factor) for t in tensors])


# ---- sparse ----
def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """A sparse COO tensor's allreduce as Horovod does it: allgather of its indices and values (an Average divides
    the values by the set size). Returns a callable giving the (uncoalesced) sparse result; synchronize() accepts
    it too."""
    _require_init()
    op = _check_reduce_op(op)
    t = tensor
    indices = _allgather_impl(t._indices().transpose(0, 1).contiguous(), process_set)[0]
    values = _allgather_impl(t._values(), process_set)[0]
    if op == Average:
        values = values / len(_ranks_of(_resolve(process_set)))

    def handle():
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())
    return handle


__all__ = ["allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_",
           "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async"]
