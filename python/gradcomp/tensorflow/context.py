"""gradcomp.tensorflow's process context: the backend init() chose, the C++ communicators and runtime it made, rank
and size, the reduce ops and the owner scopes. Every other module of the package reads it; it imports none of them
and no TensorFlow."""
from .._compressors import InvalidArgument

from .._ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (horovod.tensorflow's reduction ops)

_OPS = (Average, Sum, Min, Max, Product)


class _Context:
    def __init__(self):
        self.backend = None       # "runtime", "mpi" or "torch" (torch.distributed's gloo group, launched by torchrun)
        self.comm = None          # the C++ communicator of every collective outside the runtime
        self.runtime_comm = None  # the runtime's own communicator (a split of comm)
        self.runtime = None       # the C++ fusion Runtime ("runtime" backend)
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.scopes = 0           # owner scopes handed out (new_scope): the same sequence on every rank


_ctx = _Context()


def new_scope(kind):
    """A namespace of its own for one owner of compressor state ("tape0", "optimizer1", ...), numbered in creation
    order, so ranks that create owners in the same order (as Horovod requires) give each the same scope."""
    scope = f"tf.{kind}{_ctx.scopes}"
    _ctx.scopes += 1
    return scope




def require_init():
    if _ctx.backend is None:
        raise InvalidArgument("gradcomp.tensorflow: call init() first")


def check_op(op, average=None):
    """Horovod's op/average pair as one op string (Average when neither is given)."""
    if average is not None:
        if op is not None:
            raise InvalidArgument("gradcomp.tensorflow: pass op= or the deprecated average=, not both")
        op = Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise InvalidArgument("gradcomp.tensorflow: op=Adasum is not supported by the TensorFlow binding "
                              "(gradcomp.torch has it)")
    if op not in _OPS:
        raise InvalidArgument(f"gradcomp.tensorflow: unknown reduce op {op!r} (valid: Average, Sum, Min, Max, "
                              "Product)")
    return op


def is_initialized():
    return _ctx.backend is not None


def _reader(field, doc):
    def read():
        require_init()
        return getattr(_ctx, field)
    read.__name__, read.__doc__ = field, doc
    return read


rank = _reader("rank", "This process's rank in the job.")
size = _reader("size", "The number of ranks.")
local_rank = _reader("local_rank", "This process's rank on its host.")
local_size = _reader("local_size", "The number of ranks on this host.")


def cross_rank():
    require_init()
    return _ctx.rank // max(_ctx.local_size, 1)


def cross_size():
    require_init()
    return (_ctx.size + _ctx.local_size - 1) // max(_ctx.local_size, 1)


def is_homogeneous():
    require_init()
    return _ctx.size % max(_ctx.local_size, 1) == 0


def backend():
    """"runtime" (the C++ fusion runtime over MPI), "mpi" (the C++ MPI communicator) or "torch" (torch.distributed's
    gloo group under the C++ collectives)."""
    require_init()
    return _ctx.backend
