"""init() and shutdown(): gradcomp.torch's context on one of the three backends (backends.py builds its
communicators), the launcher's local rank and size, the process sets named at init, and an orderly teardown at
exit."""
import atexit
import os

from .._compressors import InvalidArgument
from . import backends, exchange
from .context import _ctx, _env_int
from .process_sets import add_process_set


def init(backend=None, timeout_s=60.0, process_sets=None, comm=None):
    """Initializes gradcomp's process group from the MPI launcher's environment (mpirun, srun) or torchrun's.

    backend: "runtime" (gradcomp's C++ fusion runtime over the MPI communicator), "mpi" (the C++ MPI communicator,
    one compressed_allreduce per gradient), "torch" (torch.distributed: gloo, or NCCL when CUDA is available), or None
    for the default: "runtime" under mpirun when the library has it, else "mpi" when it has the MPI communicator,
    else "torch". The environment variable GRADCOMP_BACKEND overrides the default.

    process_sets (Horovod's): ProcessSet objects (or lists of global ranks) registered right after initialization,
    in order, as add_process_set() would (every rank passes the same list); "dynamic" is accepted (sets can always
    be added and removed later). comm (Horovod's): only None or the list of every rank: gradcomp initializes on the
    launcher's whole world (use process sets for subsets).
    """
    if comm is not None and (not isinstance(comm, (list, tuple)) or sorted(int(r) for r in comm) != list(
            range(_env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", default=len(comm))))):
        raise InvalidArgument("gradcomp.torch.init(comm=...): gradcomp initializes on the launcher's whole world; "
                              "pass comm=None and use process_sets=[...] (or add_process_set) for subsets of ranks")
    if process_sets is not None and process_sets != "dynamic" and not isinstance(process_sets, (list, tuple)):
        raise InvalidArgument(f"gradcomp.torch.init(process_sets=...): a list of ProcessSet or 'dynamic', got "
                              f"{type(process_sets).__name__}")
    if _ctx.impl is not None:
        return
    impl = backends.make(backend or os.environ.get("GRADCOMP_BACKEND") or backends.default_name())
    impl.open(timeout_s)
    _ctx.impl = impl
    atexit.register(_shutdown_at_exit)
    _ctx.local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK",
                               default=0 if _ctx.size == 1 else _ctx.rank)
    _ctx.local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE",
                               default=_ctx.size)
    if process_sets not in (None, "dynamic"):
        for ps in process_sets:
            add_process_set(ps)


def _shutdown_at_exit():
    """Orderly teardown at interpreter exit: without it gloo may abort when a peer closes its sockets first."""
    try:
        if _ctx.impl is not None:
            _ctx.impl.at_exit()
        shutdown()
    except Exception:  # exit must not fail because a peer is gone
        pass


def shutdown():
    """Releases the process group (init() may be called again)."""
    exchange.close_all()
    from . import process_sets  # the added process sets end with the process group (init() starts without them)
    process_sets._reset()
    if _ctx.impl is not None:
        _ctx.impl.close()
    _ctx.__init__()
