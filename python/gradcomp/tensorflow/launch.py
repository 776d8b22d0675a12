"""init() and shutdown() of gradcomp.tensorflow: the communicator from the launcher's environment (mpirun, srun,
gradcomprun: the C++ MPI communicator, and the fusion runtime over it; torchrun or `gradcomprun --gloo`: the
torch.distributed gloo group that gradcomp.torch sets up, under the same C++ collectives; no launcher: one process)."""
import atexit
import os

from .. import _gradcomp as _C
from .._compressors import InvalidArgument
from .._gradcomp import CommError
from .._env import env_int
from .context import _ctx

_BACKENDS = ("runtime", "mpi", "torch")


def _default_backend():
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        return "runtime" if _C.has_runtime else "mpi"
    if env_int("WORLD_SIZE", default=1) > 1:
        return "torch"
    return "mpi"


def init(backend=None, timeout_s=60.0, process_sets=None, comm=None):
    """Initializes gradcomp.tensorflow from the launcher's environment (a second call does nothing).

    backend: "runtime" (the C++ fusion runtime over the MPI communicator: negotiation by name, fusion, every codec;
    the default under mpirun), "mpi" (the C++ MPI communicator, one compressed allreduce per tensor; the default for
    a single process), "torch" (torch.distributed's gloo group made by gradcomp.torch.init() from torchrun's
    RANK/WORLD_SIZE/MASTER_ADDR, under the same C++ collectives; the default when WORLD_SIZE > 1 and no MPI launcher).
    GRADCOMP_BACKEND overrides the default. timeout_s bounds every blocking collective. process_sets and comm
    (Horovod's) accept only the whole world (None, "dynamic" or every rank): InvalidArgument otherwise.
    """
    if process_sets not in (None, "dynamic", []):
        raise InvalidArgument("gradcomp.tensorflow.init(process_sets=...): process sets are not supported by the "
                              "TensorFlow binding (gradcomp.torch has them); pass None")
    if comm is not None:
        world = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", default=1)
        if sorted(int(r) for r in comm) != list(range(world)):
            raise InvalidArgument("gradcomp.tensorflow.init(comm=...): gradcomp initializes on the launcher's "
                                  "whole world; pass comm=None")
    if _ctx.backend is not None:
        return
    backend = backend or os.environ.get("GRADCOMP_BACKEND") or _default_backend()
    if backend not in _BACKENDS:
        raise InvalidArgument(f"gradcomp.tensorflow.init(): unknown backend '{backend}' (valid: "
                              f"{', '.join(_BACKENDS)})")
    if backend == "torch":
        _init_torch(timeout_s)
    else:
        if backend == "runtime" and not _C.has_runtime:
            raise CommError("gradcomp.tensorflow.init(backend='runtime'): this build has no fusion runtime")
        _ctx.comm = _C.make_mpi_world_communicator(timeout_s)
        _ctx.rank, _ctx.size = _ctx.comm.rank, _ctx.comm.size
        if backend == "runtime":
            # The runtime owns its communicator; broadcasts, gathers and metric allreduces use the world one.
            _ctx.runtime_comm = _ctx.comm.split(0, _ctx.rank)
            _ctx.runtime = _C.Runtime(_ctx.runtime_comm, default_spec="none", op="average", timeout_s=timeout_s)
    _ctx.backend = backend
    _ctx.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK",
                              default=0 if _ctx.size == 1 else _ctx.rank)
    _ctx.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE",
                              default=_ctx.size)
    atexit.register(shutdown)


def _init_torch(timeout_s):
    """The gloo group of gradcomp.torch (TensorFlow tensors live on the host, so gloo even where CUDA exists) and
    the world Communicator gradcomp.torch's context holds for the caller's thread."""
    try:
        from .. import torch as gtorch
        from ..torch.context import _ctx as torch_ctx
    except ImportError as e:
        raise CommError("gradcomp.tensorflow.init(backend='torch'): torchrun-style launches (RANK/WORLD_SIZE "
                        f"without mpirun) need PyTorch for the gloo rendezvous ({e}); launch with mpirun or "
                        "`gradcomprun` without --gloo instead") from e
    os.environ.setdefault("GRADCOMP_TORCH_PG", "gloo")
    gtorch.init(backend="torch", timeout_s=timeout_s)
    _ctx.comm = torch_ctx.comm
    _ctx.rank, _ctx.size = gtorch.rank(), gtorch.size()


def shutdown():
    """Ends the runtime and the communicators (init() may be called again)."""
    if _ctx.runtime is not None:
        _ctx.runtime.shutdown()
    if _ctx.backend == "torch":
        from .. import torch as gtorch
        gtorch.shutdown()
    _ctx.__init__()
