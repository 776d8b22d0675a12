"""Horovod's process-wide collectives: allreduce (uncompressed, or through a codec on the init()'s backend), broadcast
of tensors, objects, a model's parameters and an optimizer's state."""
import pickle

import torch
import torch.distributed as dist

from .._compressors import Compression, InvalidArgument, compressor
from .backends import _Backend, _exchange_view
from .context import Average, _check_op, _ctx, _require_init


def allreduce(tensor, average=None, name=None, op=None, compression=None):
    """Returns the average (or sum) of `tensor` over all ranks (uncompressed unless `compression` is given)."""
    _require_init()
    op = _check_op(op, average)
    out = tensor.detach().clone().contiguous()
    if compression is None or compression == Compression.none:
        if _ctx.backend in ("mpi", "runtime"):
            _ctx.comm.allreduce(out.view(-1), op)
        else:
            dist.all_reduce(out)
            if op == Average:
                out.div_(_ctx.size)
        return out
    c = compressor(compression)
    _Backend.get().allreduce(c, name or "allreduce", _exchange_view(out, c), 0, op).wait()
    return out


def allreduce_(tensor, average=None, name=None, op=None):
    tensor.copy_(allreduce(tensor, average=average, name=name, op=op))
    return tensor


def broadcast_(tensor, root_rank, name=None):
    """In place: every rank's `tensor` becomes root_rank's."""
    _require_init()
    if _ctx.backend in ("mpi", "runtime"):
        if not tensor.is_contiguous():
            raise InvalidArgument(f"broadcast_('{name}'): tensor must be contiguous")
        _ctx.comm.broadcast(tensor.detach().view(-1).view(torch.uint8), root_rank)
    else:
        dist.broadcast(tensor.detach(), root_rank)
    return tensor


def broadcast(tensor, root_rank, name=None):
    return broadcast_(tensor.detach().clone().contiguous(), root_rank, name)


def broadcast_object(obj, root_rank=0, name=None):
    """Pickles `obj` on root_rank and returns it on every rank."""
    _require_init()
    if _ctx.size == 1:
        return obj
    if _ctx.backend == "torch":
        box = [obj]
        dist.broadcast_object_list(box, src=root_rank)
        return box[0]
    data = pickle.dumps(obj) if _ctx.rank == root_rank else b""
    length = torch.tensor([len(data)], dtype=torch.int64)
    broadcast_(length, root_rank)
    buf = torch.zeros(int(length.item()), dtype=torch.uint8)
    if _ctx.rank == root_rank:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    broadcast_(buf, root_rank)
    return pickle.loads(buf.numpy().tobytes())


def broadcast_parameters(params, root_rank=0):
    """Broadcasts a model's ``state_dict()`` or ``named_parameters()`` from root_rank (as horovod.torch does)."""
    _require_init()
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise InvalidArgument("broadcast_parameters: pass model.state_dict() or model.named_parameters()")
    else:
        raise InvalidArgument(f"broadcast_parameters: invalid params of type {type(params).__name__}")
    with torch.no_grad():
        for name, p in items:
            if torch.is_tensor(p):
                broadcast_(p, root_rank, name)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Makes every rank's optimizer state (hyper-parameters, momenta, gradcomp compressor state) root_rank's."""
    _require_init()
    if _ctx.size == 1:
        return
    state = optimizer.state_dict() if _ctx.rank == root_rank else None
    if state is not None:
        # gradcomp's state (residuals, the runtime's) is per rank and refuses to load on another: each keeps its own.
        state = {k: v for k, v in state.items() if k != "gradcomp"}
    state = broadcast_object(state, root_rank)
    if _ctx.rank != root_rank:
        optimizer.load_state_dict(state)
