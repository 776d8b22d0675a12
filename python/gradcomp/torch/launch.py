"""init() and shutdown(): the process group from the launcher's environment (mpirun, srun, torchrun) on one of the
three backends, the rendezvous port the ranks agree on, and an orderly teardown at exit."""
import atexit
import datetime
import hashlib
import os
import socket

import torch
import torch.distributed as dist

from .. import _gradcomp as _C
from .._compressors import InvalidArgument
from .._gradcomp import CommError
from . import exchange
from .context import _ctx, _env_int
from .process_sets import add_process_set


def _rendezvous_port():
    explicit = _env_int("GRADCOMP_MASTER_PORT", "MASTER_PORT")
    if explicit:
        return explicit
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMI_ID")
    if job is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    return 20000 + int(hashlib.sha1(job.encode()).hexdigest(), 16) % 20000


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
    if _ctx.backend is not None:
        return
    backend = backend or os.environ.get("GRADCOMP_BACKEND") or None
    under_mpi = "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ
    if backend is None:
        if under_mpi and _C.has_runtime:
            backend = "runtime"
        elif under_mpi and _C.has_collectives:
            backend = "mpi"
        else:
            backend = "torch"
    if backend in ("mpi", "runtime"):
        if not _C.has_collectives or (backend == "runtime" and not _C.has_runtime):
            raise CommError(f"gradcomp.torch.init(backend='{backend}'): this build of gradcomp has no "
                            f"{'fusion runtime' if backend == 'runtime' else 'MPI communicator'}; use backend='torch'")
        _ctx.comm = _C.make_mpi_world_communicator(timeout_s)
        _ctx.rank, _ctx.size = _ctx.comm.rank, _ctx.comm.size
        if backend == "runtime":
            # The runtime owns its communicator; broadcasts and metric allreduces use the world one.
            _ctx.runtime_comm = _ctx.comm.split(0, _ctx.rank)
            _ctx.device_comm = _make_device_comm(_ctx.comm)
            _ctx.runtime = _C.Runtime(_ctx.runtime_comm, default_spec="none", op="average", timeout_s=timeout_s,
                                      device_comm=_ctx.device_comm)
    elif backend == "torch":
        if dist.is_initialized():
            _ctx.rank, _ctx.size = dist.get_rank(), dist.get_world_size()
        else:
            rank = _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK", default=0)
            size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", default=1)
            local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=size)
            addr = os.environ.get("GRADCOMP_MASTER_ADDR") or os.environ.get("MASTER_ADDR")
            if addr is None:
                if local_size != size:
                    raise InvalidArgument("gradcomp.torch.init(): a multi-node job needs MASTER_ADDR (the host of "
                                          "rank 0) in the environment")
                addr = "127.0.0.1"
            port = _rendezvous_port()
            pg_backend = "nccl" if (torch.cuda.is_available() and os.environ.get("GRADCOMP_TORCH_PG") != "gloo") \
                else "gloo"
            # GRADCOMP_INIT_METHOD (e.g. file:///shared/path) replaces the TCP rendezvous.
            init_method = os.environ.get("GRADCOMP_INIT_METHOD") or f"tcp://{addr}:{port}"
            dist.init_process_group(pg_backend, init_method=init_method, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            _ctx.owns_process_group = True
            _ctx.rank, _ctx.size = rank, size
    else:
        raise InvalidArgument(f"gradcomp.torch.init(): unknown backend '{backend}' (valid: mpi, torch)")
    if backend == "torch" and _ctx.size > 1:
        _ctx.control_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    _ctx.backend = backend
    atexit.register(_shutdown_at_exit)
    _ctx.local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK",
                               default=0 if _ctx.size == 1 else _ctx.rank)
    _ctx.local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE",
                               default=_ctx.size)
    if process_sets not in (None, "dynamic"):
        for ps in process_sets:
            add_process_set(ps)


def _make_device_comm(world):
    """The runtime's communicator for CUDA tensors: NCCL on this rank's GPU (local rank modulo the GPUs visible), so
    CUDA gradients stay on the device (CUDA codec, NCCL, CUDA decode). None when this process sees no GPU, the build
    has no NCCL, or GRADCOMP_DEVICE_COMM=none; CUDA tensors then go through the MPI communicator, staged through host
    memory once per fused buffer (runtime.stats()["staged_bytes"]). Collective over `world`."""
    if os.environ.get("GRADCOMP_DEVICE_COMM", "nccl") == "none" or not _C.has_nccl:
        return None
    if not torch.cuda.is_available():
        return None
    local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK",
                          default=world.rank)
    device = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    return _C.make_nccl_communicator(world, device)


def _shutdown_at_exit():
    """Orderly teardown at interpreter exit: without it gloo may abort when a peer closes its sockets first."""
    try:
        if _ctx.backend == "torch" and _ctx.owns_process_group and dist.is_initialized():
            dist.barrier()
        shutdown()
    except Exception:  # exit must not fail because a peer is gone
        pass


def shutdown():
    """Releases the process group (init() may be called again)."""
    exchange.close_all()
    from . import process_sets  # the added process sets end with the process group (init() starts without them)
    process_sets._reset()
    if _ctx.control_group is not None and dist.is_initialized() and not _ctx.owns_process_group:
        try:
            dist.destroy_process_group(_ctx.control_group)
        except Exception:  # torch versions that cannot destroy a subgroup: it ends with the default group
            pass
    if _ctx.backend == "torch" and _ctx.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()
    if _ctx.runtime is not None:
        _ctx.runtime.shutdown()
    _ctx.runtime = None
    _ctx.device_comm = None  # after the runtime that uses it
    _ctx.__init__()
