"""Horovod's object and model-state utilities: broadcast_object / allgather_object (cloudpickle, as Horovod: lambdas,
local classes and closures travel), broadcast_parameters (a state_dict, named_parameters() or a plain list of tensors) and
broadcast_optimizer_state (a fresh optimizer's state is created first, as Horovod does)."""
import io
import pickle

import torch

from .._compressors import InvalidArgument
from .context import _ctx, _require_init
from .process_sets import _resolve, global_process_set
from .gathers import broadcast_
from . import comm_ops as _ops

try:
    import cloudpickle
except ImportError:  # a dependency of the package; reported at the first use
    cloudpickle = None


def _dumps(obj):
    """obj serialized with cloudpickle (its output is read back by pickle.loads)."""
    if cloudpickle is None:
        raise InvalidArgument("broadcast_object/allgather_object need cloudpickle, a dependency of gradcomp "
                              "(pip install cloudpickle; Debian: python3-cloudpickle)")
    b = io.BytesIO()
    cloudpickle.dump(obj, b)
    return b.getvalue()


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (serialized with cloudpickle) on every rank of the set. If the root cannot
    serialize it, every rank raises (InvalidArgument naming the root's error), none waits for the timeout."""
    _require_init()
    ps = _resolve(process_set)
    if ps.size() == 1:
        return obj
    error = None
    data = b""
    if _ctx.rank == root_rank:
        try:
            data = _dumps(obj)
        except Exception as e:  # noqa: BLE001 - any pickling failure is reported to every rank
            error = f"{type(e).__name__}: {e}"
            data = error.encode()
    # Header: payload length and whether it is an error message.
    header = torch.tensor([len(data), 1 if error else 0], dtype=torch.int64)
    broadcast_(header, root_rank, process_set=ps)
    buf = torch.zeros(int(header[0]), dtype=torch.uint8)
    if _ctx.rank == root_rank and len(data):
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    broadcast_(buf, root_rank, process_set=ps)
    payload = buf.numpy().tobytes()
    if int(header[1]):
        raise InvalidArgument(f"broadcast_object{f' ({name})' if name else ''}: rank {root_rank} could not "
                              f"serialize the object: {payload.decode(errors='replace')}")
    return pickle.loads(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj` as a list in rank order (cloudpickle). A rank that cannot serialize its object
    makes every rank raise."""
    _require_init()
    ps = _resolve(process_set)
    try:
        data, error = _dumps(obj), 0
    except Exception as e:  # noqa: BLE001
        data, error = f"{type(e).__name__}: {e}".encode(), 1
    flags = _ops.allgather_fixed(torch.tensor([error], dtype=torch.int64), ps.communicator())
    gathered, dims = _ops.allgatherv(torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
                                    else torch.zeros(0, dtype=torch.uint8), ps.communicator(), "allgather_object")
    blobs, offset = [], 0
    for d in dims:
        blobs.append(gathered[offset:offset + d].numpy().tobytes())
        offset += d
    bad = [i for i in range(len(dims)) if int(flags[i, 0])]
    if bad:
        raise InvalidArgument(f"allgather_object{f' ({name})' if name else ''}: set rank {bad[0]} could not "
                              f"serialize its object: {blobs[bad[0]].decode(errors='replace')}")
    return [pickle.loads(b) for b in blobs]


def broadcast_parameters(params, root_rank=0, process_set=global_process_set):
    """Broadcasts from root_rank a model's ``state_dict()`` (sorted by name), ``named_parameters()`` or a list of
    tensors or (name, tensor) pairs (``list(model.parameters())``), in place, as horovod.torch does."""
    _require_init()
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise InvalidArgument(f"broadcast_parameters: invalid params of type {type(params).__name__}")
    with torch.no_grad():
        for name, p in items:
            if torch.is_tensor(p):
                broadcast_(p, root_rank, name, process_set)


def _create_state(optimizer):
    """Horovod's initialization of a fresh optimizer's state: zero gradients and one step of the wrapped optimizer
    (never DistributedOptimizer's step, which would start an allreduce)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    if hasattr(optimizer, "_gradcomp_setup"):  # DistributedOptimizer: an instance of the wrapped class's subclass
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer, root_rank=0, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (hyper-parameters, momenta) root_rank's; a fresh optimizer's state is
    created first (zero gradients and one step, as Horovod). gradcomp's own state (compressor residuals, under
    "gradcomp") is per rank and stays."""
    _require_init()
    if isinstance(optimizer, torch.optim.LBFGS):
        raise InvalidArgument("cannot broadcast torch.optim.LBFGS state")
    if len(optimizer.state) == 0:
        _create_state(optimizer)
    if len(optimizer.state) == 0 or _resolve(process_set).size() == 1:
        return  # a stateless optimizer (plain SGD): nothing to broadcast
    state = optimizer.state_dict() if _ctx.rank == root_rank else None
    if state is not None:
        state = {k: v for k, v in state.items() if k != "gradcomp"}
    state = broadcast_object(state, root_rank, process_set=process_set)
    if _ctx.rank != root_rank:
        optimizer.load_state_dict(state)
