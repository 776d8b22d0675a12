"""Horovod's topology and build queries (cross_rank, cross_size, is_homogeneous, *_built, *_enabled,
mpi_threads_supported) and start_timeline / stop_timeline.

Nodes: ranks [k*local_size, (k+1)*local_size) form node k (the launcher's local size; GRADCOMP_LOCAL_SIZE as in the
C++ Communicator::node_color()). cross_rank is the node index, cross_size the node count, as Horovod's cross
communicator (ranks of equal local_rank)."""
import os

import torch

from .. import _gradcomp as _C
from .._compressors import InvalidArgument
from .context import _ctx, _env_int, _require_init


def _local_size():
    return _env_int("GRADCOMP_LOCAL_SIZE", default=None) or _ctx.local_size or 1


def cross_rank():
    _require_init()
    return _ctx.rank // _local_size()


def cross_size():
    _require_init()
    return -(-_ctx.size // _local_size())


def is_homogeneous():
    """True when every node has the same number of ranks."""
    _require_init()
    return _ctx.size % _local_size() == 0


def mpi_built():
    return bool(getattr(_C, "has_collectives", False))


def mpi_enabled():
    """True when init() chose a backend over gradcomp's MPI communicator ("mpi" or "runtime")."""
    return _ctx.backend in ("mpi", "runtime")


def mpi_threads_supported():
    """gradcomp's MPI communicator serializes its calls; MPI itself is initialized with MPI_THREAD_MULTIPLE when
    available. Horovod's meaning (may other threads call MPI?) is answered False for safety off the mpi backends."""
    _require_init()
    return mpi_enabled()


def gloo_built():
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


def gloo_enabled():
    """True on the torch backend over a gloo process group."""
    return _ctx.backend == "torch" and torch.distributed.is_initialized() \
        and torch.distributed.get_backend() == "gloo"


def nccl_built():
    return bool(getattr(_C, "has_nccl", False))


def cuda_built():
    return bool(getattr(_C, "has_cuda", False)) or nccl_built()


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """The C++ runtime writes its timeline (Chrome trace JSON) from construction when GRADCOMP_TIMELINE names a file
    (docs/runtime.md); it cannot start one later. start_timeline(path) is a no-op when that timeline is the one
    asked for, and raises InvalidArgument otherwise (set GRADCOMP_TIMELINE=path before init(); the "mpi" and "torch"
    backends have no timeline)."""
    _require_init()
    current = os.environ.get("GRADCOMP_TIMELINE", "")
    if _ctx.backend == "runtime" and current and os.path.abspath(current) == os.path.abspath(str(file_path)):
        return
    raise InvalidArgument(f"start_timeline('{file_path}'): gradcomp's timeline is the fusion runtime's, written from "
                          f"init() when GRADCOMP_TIMELINE names the file (backend '{_ctx.backend}', "
                          f"GRADCOMP_TIMELINE='{current}'): set GRADCOMP_TIMELINE={file_path} before init() with the "
                          f"runtime backend")


def stop_timeline():
    """No-op: the runtime's timeline is closed by shutdown()."""
    _require_init()
