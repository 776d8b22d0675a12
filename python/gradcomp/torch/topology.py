"""Horovod's topology and build queries (cross_rank, cross_size, is_homogeneous, *_built, *_enabled,
mpi_threads_supported) and start_timeline / stop_timeline.

Nodes: ranks [k*local_size, (k+1)*local_size) form node k (the launcher's local size; GRADCOMP_LOCAL_SIZE as in the
C++ Communicator::node_color()). cross_rank is the node index, cross_size the node count, as Horovod's cross
communicator (ranks of equal local_rank)."""

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
    return _ctx.impl is not None and _ctx.impl.over_mpi


def mpi_threads_supported():
    """gradcomp's MPI communicator serializes its calls; MPI itself is initialized with MPI_THREAD_MULTIPLE when
    available. Horovod's meaning (may other threads call MPI?) is answered False for safety off the mpi backends."""
    _require_init()
    return mpi_enabled()


def gloo_built():
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


def gloo_enabled():
    """True on the torch backend over a gloo process group."""
    return _ctx.impl is not None and _ctx.impl.gloo()


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
    """Starts the fusion runtime's Chrome-trace timeline (negotiation, queue, fusion copies, compress / communicate /
    decompress per buffer) in `file_path` ("{rank}" in the path gives one file per rank; otherwise rank 0 writes it),
    closing the one being written. mark_cycles is accepted for Horovod compatibility (every cycle that does work is
    marked). The "mpi" and "torch" backends have no runtime: InvalidArgument."""
    _require_init()
    if _ctx.runtime is None:
        raise InvalidArgument(f"start_timeline('{file_path}'): the timeline is the fusion runtime's; backend "
                              f"'{_ctx.impl.name}' has none (init(backend='runtime') under mpirun)")
    _ctx.runtime.start_timeline(str(file_path))


def stop_timeline():
    """Closes the runtime's timeline file (a no-op on the other backends)."""
    _require_init()
    if _ctx.runtime is not None:
        _ctx.runtime.stop_timeline()


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Horovod's check that a framework extension was built: gradcomp has one extension for every framework it
    supports (gradcomp._gradcomp, loaded with this module); raises ImportError naming `ext_name` when it is absent."""
    if _C is None or not hasattr(_C, "Compressor"):
        raise ImportError(f"Extension {ext_name} has not been built: gradcomp's native module gradcomp._gradcomp is "
                          f"missing (build with -DGRADCOMP_WITH_PYTHON=ON)")
