"""gradcomp's DDP communication hook: each GradBucket goes whole through the C++ compressed_allreduce (see
_torch_comm.allreduce_async), with one segment per parameter so error feedback is keyed by parameter name."""
import hashlib

from . import _torch_comm
from ._compressors import compressor
from ._gradcomp import Error


class HookState:
    """State of gradcomp's DDP comm hook: the compressor (error feedback keyed by parameter name), the step counter
    and the process group. ``state_dict()`` / ``load_state_dict()`` checkpoint all of it. ``last_stats`` maps each
    bucket's name to the AllreduceStats of its latest exchange (``algorithm``: dense, sparse, sra or allgather;
    ``switched_to_dense``, ``payload_bytes``, ``wire_bytes``, seconds), filled when its future completes."""

    def __init__(self, spec, model=None, process_group=None, hierarchical=False, **params):
        self.compressor = compressor(spec, **params)
        self.process_group = process_group
        self.hierarchical = bool(hierarchical)
        self.step = 0
        self.last_stats = {}
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
        return {"spec": self.compressor.spec, "step": self.step, "compressor": self.compressor.state_dict()}

    def load_state_dict(self, state):
        self.compressor.load_state_dict(state["compressor"])
        self.step = int(state["step"])


def bucket_segments(state, bucket):
    """(flat buffer, [(parameter name, offset, numel)]) of a DDP GradBucket."""
    buffer = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    params = bucket.parameters() if hasattr(bucket, "parameters") else bucket.get_model_params_for_bucket()
    segments = []
    offset = 0
    for p in params:
        segments.append((state.name_of(p), offset, p.numel()))
        offset += p.numel()
    if offset != buffer.numel():
        raise Error(f"gradcomp DDP hook: bucket {bucket.index()} holds {buffer.numel()} elements but its parameters "
                    f"have {offset}; parameters with sparse or non-contiguous gradients are not supported")
    return buffer, segments


def bucket_name(segments):
    """Name of a bucket's exchange, from the parameters it carries (identical on every rank and after a restart;
    DDP's rebuilt buckets get their own): keys the codec's random streams."""
    names = [n for n, _, _ in segments]
    digest = hashlib.sha1("\0".join(names).encode()).hexdigest()[:8]
    return f"ddp[{names[0]}..{names[-1]}#{digest}]" if len(names) > 1 else f"ddp[{names[0]}]"


def _gradcomp_hook(state, bucket):
    buffer, segments = bucket_segments(state, bucket)
    name = bucket_name(segments)
    stats = state.last_stats[name] = {}
    fut = _torch_comm.allreduce_async(state.compressor, buffer, name, state.step, op="average", segments=segments,
                                      group=state.process_group, result=buffer, stats=stats,
                                      hierarchical=state.hierarchical)
    if bucket.is_last():
        state.step += 1
    return fut


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
