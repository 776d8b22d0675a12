"""gradcomp's DDP communication hook: each GradBucket goes whole through the C++ compressed_allreduce (see
exchange.allreduce_async), with one segment per parameter so error feedback is keyed by parameter name."""
import copy
import functools
import hashlib

import torch.distributed as dist
from torch.autograd import Variable

from .. import _state
from .._compressors import owned_compressor
from .._gradcomp import Error
from . import exchange


class HookState:
    """State of gradcomp's DDP comm hook: the compressor (error feedback keyed by parameter name), the step counter
    and the process group. ``state_dict()`` / ``load_state_dict()`` checkpoint all of it. ``last_stats`` maps each
    bucket's name to the AllreduceStats of its latest exchange (``algorithm``: dense, sparse, sra or allgather;
    ``switched_to_dense``, ``payload_bytes``, ``wire_bytes``, seconds), filled when its future completes."""

    def __init__(self, spec, model=None, process_group=None, hierarchical=False, **params):
        self.compressor = owned_compressor(spec, **params)
        self.process_group = process_group
        self.hierarchical = bool(hierarchical)
        self.step = 0
        self.last_stats = {}
        self._in_flight = None  # this backward pass's futures (see _raise_errors_in_backward)
        self._names = {}
        if model is not None:
            self._names = {id(p): name for name, p in model.named_parameters()}

    def name_of(self, param):
        """Stable name of a parameter: its name in `model`, else the order it was first seen in (identical on every
        rank, and again after a restart, because DDP's first buckets are built in parameter order)."""
        key = id(param)
        name = self._names.get(key)
        if name is None:
            name = f"param{len(self._names)}"
            self._names[key] = name
        return name

    def state_dict(self):
        """This rank's residuals and step in a checksummed envelope (kind "ddp_hook", spec, rank, world size; see
        gradcomp._state). Residuals are per rank: save one file per rank."""
        rank, world = self._rank_and_size()
        return _state.seal("ddp_hook", self.compressor.spec, self.compressor._state_bytes(), rank, world, self.step)

    def load_state_dict(self, state):
        """Restores this rank's own ``state_dict()``. Flipped or truncated bytes raise CorruptPayload; another rank's,
        world size's or codec's state InvalidArgument; a failed load changes nothing."""
        rank, world = self._rank_and_size()
        data, step = _state.open_state(state, "ddp_hook", self.compressor.spec, rank, world,
                                       where="HookState.load_state_dict")
        self.compressor._load_state_bytes(data)
        self.step = int(step)

    def _rank_and_size(self):
        if not dist.is_initialized():
            return 0, 1
        return dist.get_rank(self.process_group), dist.get_world_size(self.process_group)


def bucket_segments(state, bucket):
    """(flat buffer, [(parameter name, offset, numel, rows)]) of a DDP GradBucket; rows is the parameter's first
    dimension when it has two or more (the matrix a shape-aware codec such as powersgd compresses), else 0."""
    buffer = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    params = bucket.parameters() if hasattr(bucket, "parameters") else bucket.get_model_params_for_bucket()
    segments = []
    offset = 0
    for p in params:
        segments.append((state.name_of(p), offset, p.numel(), p.shape[0] if p.dim() >= 2 else 0))
        offset += p.numel()
    if offset != buffer.numel():
        raise Error(f"gradcomp DDP hook: bucket {bucket.index()} holds {buffer.numel()} elements but its parameters "
                    f"have {offset}; parameters with sparse or non-contiguous gradients are not supported")
    return buffer, segments


def bucket_name(segments):
    """Name of a bucket's exchange, from the parameters it carries (identical on every rank and after a restart;
    DDP's rebuilt buckets get their own): keys the codec's random streams."""
    names = [segment[0] for segment in segments]
    digest = hashlib.sha1("\0".join(names).encode()).hexdigest()[:8]
    return f"ddp[{names[0]}..{names[-1]}#{digest}]" if len(names) > 1 else f"ddp[{names[0]}]"


def _gradcomp_hook(state, bucket):
    buffer, segments = bucket_segments(state, bucket)
    name = bucket_name(segments)
    stats = state.last_stats[name] = {}
    fut = exchange.allreduce_async(state.compressor, buffer, name, state.step, op="average", segments=segments,
                                   group=state.process_group, result=buffer, stats=stats,
                                   hierarchical=state.hierarchical)
    last = bucket.is_last()
    if last:
        state.step += 1
    _raise_errors_in_backward(state, fut, last)
    return fut


def _raise_errors_in_backward(state, fut, last):
    """DDP's reducer reads each hook future's value as a Tensor, so a future that carries an exception reached the
    user as "RuntimeError: Unable to cast <message> to Tensor". The first bucket of a backward pass therefore queues
    an autograd-engine callback, which runs at the end of backward before DDP's own (queued after the last bucket):
    it waits for the pass's futures and raises the first gradcomp exception itself, so ``loss.backward()`` raises
    gradcomp.InvalidArgument / Timeout / CommError with its message. Outside backward (the hook called directly)
    ``fut.wait()`` raises it."""
    if state._in_flight is None:
        state._in_flight = [fut]
        try:
            Variable._execution_engine.queue_callback(functools.partial(_raise_first_error, state._in_flight))
        except RuntimeError:  # not inside a backward pass
            state._in_flight = None
            return
    else:
        state._in_flight.append(fut)
    if last:
        state._in_flight = None  # the next call starts a new pass, whether or not this pass's callback runs


def _raise_first_error(futures):
    error = None
    for fut in futures:
        try:
            fut.wait()
        except Exception as e:  # noqa: BLE001 - the first one is raised below, after every exchange has finished
            error = error or e
            e.__traceback__ = None
    if error is not None:
        # A copy: the object inside the future must not take the traceback of the frames above (the caller's, which
        # hold the DDP model, whose C++ reducer holds the future: an uncollectable cycle that kept the hook's
        # compressor alive at exit).
        raise copy.copy(error)


def ddp_comm_hook(spec="topk:ratio=0.01", model=None, process_group=None, hierarchical=False, **params):
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``: each bucket goes through gradcomp's C++
    compressed_allreduce (spec like ``"topk:ratio=0.01"``, a Compression name or a Python-registered codec), the
    algorithm chosen by the codec's traits.

    Pass ``model`` so residuals are keyed by parameter names. ``hierarchical=True``: dense sum inside each node
    (``GRADCOMP_LOCAL_SIZE`` ranks per node), compressed between node leaders (the group must span the whole job).
    Works on gloo (CPU) and NCCL (GPU) groups.
    """
    return HookState(spec, model=model, process_group=process_group, hierarchical=hierarchical, **params), \
        _gradcomp_hook
