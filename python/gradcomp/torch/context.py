"""gradcomp.torch's process context: the backend init() opened, the communicators and runtime it made, rank and size,
and the queries on them (rank(), size(), ...); the reduce ops. Every other module of the package reads it; it imports
none of them."""
from .._compressors import InvalidArgument
from .._env import env_int as _env_int  # noqa: F401  (read by launch.py and others as context._env_int)
from .._ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (horovod.torch's reduction ops)


class _Context:
    def __init__(self):
        self.impl = None          # the backend init() opened (backends.py: "runtime", "mpi" or "torch")
        self.comm = None          # the world's C++ Communicator (MPI, or TorchCommunicator over the default group)
        self.control_comm = None  # the Communicator of join()'s control rounds (the world's, or a gloo group's)
        self.runtime_comm = None  # the runtime's own communicator (a split of comm)
        self.runtime = None       # C++ fusion Runtime for the "runtime" backend
        self.device_comm = None   # the runtime's NCCL communicator for CUDA tensors (None: CUDA tensors use MPI)
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.owns_process_group = False
        self.control_group = None  # torch backend: the gloo group under control_comm
        self.notes = None  # join_notes.Notes: how a joined rank learns what to serve (None on one rank)
        self.notes_group = None  # torch backend: the gloo group the notes travel on
        self.notes_missing = None  # why this world has no notes (join() raises it), e.g. MPI without thread support
        self.scopes = 0  # owner scopes handed out (new_scope): the same sequence on every rank


def new_scope(kind):
    """A namespace of its own for one owner of compressor state (an optimizer, a hook): "optimizer0", "hook1", ...
    Owners are numbered in creation order, so every rank that creates them in the same order (as Horovod requires of
    named collectives) gives each the same scope; the runtime negotiates (scope, tensor name)."""
    scope = f"{kind}{_ctx.scopes}"
    _ctx.scopes += 1
    return scope


# The one context of the process (reset in place by shutdown(), so every module's reference stays valid).
_ctx = _Context()


def _require_init():
    if _ctx.impl is None:
        raise InvalidArgument("gradcomp.torch: call init() first")


def _check_op(op, average=None):
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = Average
    if op not in (Average, Sum):
        raise InvalidArgument(f"gradcomp.torch: reduce op '{op}' is not supported (valid: Average, Sum)")
    return op


def is_initialized():
    return _ctx.impl is not None


def rank():
    _require_init()
    return _ctx.rank


def size():
    _require_init()
    return _ctx.size


def local_rank():
    _require_init()
    return _ctx.local_rank


def local_size():
    _require_init()
    return _ctx.local_size


def backend():
    """"runtime" (C++ fusion runtime), "mpi" (C++ communicator) or "torch" (torch.distributed)."""
    _require_init()
    return _ctx.impl.name
