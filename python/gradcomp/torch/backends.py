"""The one module where gradcomp.torch's backends differ. init() picks one of them and every other module works on
what it builds: a C++ Communicator for the world (``_ctx.comm``), one per process set (``split``), one for the join
protocol's control rounds (``_ctx.control_comm``), and the compressed allreduce of DistributedOptimizer and
allreduce(compression=...). The Python collectives (process_sets.py, adasum.py, optimizer_sparse.py, objects.py) are
written once against a Communicator and never ask which backend built it.

- "runtime": gradcomp's C++ MPI communicator and the C++ fusion runtime on a split of it (plus an NCCL communicator
  for CUDA tensors when the build and the process have them); compressed allreduces go through the runtime.
- "mpi": the C++ MPI communicator; one C++ compressed_allreduce per gradient, on the caller's thread.
- "torch": torch.distributed (gloo, or NCCL when CUDA is available) seen as a Communicator (``TorchCommunicator``
  over exchange.ProcessGroupAdapter); compressed allreduces run in the process group's exchange worker, as the DDP
  hook's.

A compressed allreduce returns a handle whose wait() completes the reduction in place. `process_set` (a registered,
resolved ProcessSet other than the global one, or None for the world) reduces over that set's communicator. `scope`
(context.new_scope) names the owner of `comp` (an optimizer): on the runtime backend the owner's own compressor
instance and namespace are handed to the runtime, so two owners never share state, names or fusion buffers; the
other backends already run the owner's instance, whose state is keyed by the tensor names it alone submits. `stats`
(a dict, optional) receives the exchange's AllreduceStats by the time wait() returns, on the "mpi" and "torch"
backends (the runtime reports its own RuntimeStats instead)."""
import datetime
import hashlib
import os
import socket

import torch
import torch.distributed as dist

from .. import _gradcomp as _C
from .._compressors import InvalidArgument
from .._gradcomp import CommError
from . import exchange, join_notes
from .context import _ctx, _env_int, _require_init

NAMES = ("runtime", "mpi", "torch")


def _exchange_view(tensor, comp):
    """A contiguous `tensor` as the C++ codecs take it: a matrix of its first dimension's rows when it has two or
    more dimensions (shape-aware codecs such as powersgd compress that matrix), else flat. Python codecs get it
    flat."""
    if tensor.dim() >= 2 and not comp.is_python and tensor.numel() > 0:
        return tensor.view(tensor.shape[0], -1)
    return tensor.view(-1)


class _Handle:
    def __init__(self, fut=None):
        self.fut = fut

    def wait(self):
        if self.fut is not None:
            self.fut.wait()


def default_name():
    """The backend init() takes when none is named: "runtime" under an MPI launcher, else "torch"."""
    under_mpi = "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ
    if under_mpi and _C.has_runtime:
        return "runtime"
    if under_mpi and _C.has_collectives:
        return "mpi"
    return "torch"


def make(name):
    """The backend object of `name` (not opened yet)."""
    kinds = {"mpi": _MpiBackend, "runtime": _RuntimeBackend, "torch": _TorchBackend}
    if name not in kinds:
        raise InvalidArgument(f"gradcomp.torch.init(): unknown backend '{name}' (valid: {', '.join(NAMES)})")
    return kinds[name]()


def current():
    """The backend init() opened (InvalidArgument before init())."""
    _require_init()
    return _ctx.impl


class _Backend:
    name = None
    over_mpi = False   # Horovod's mpi_enabled(): gradcomp's MPI communicator carries the collectives
    elastic = False    # the world can shrink and grow (torchrun's elastic agent)

    def open(self, timeout_s):
        """Sets _ctx.comm, rank and size (and what else the backend owns). Collective over the world."""
        raise NotImplementedError

    def close(self):
        """Releases what open() made (the context is reset by the caller)."""
        _close_notes()

    def at_exit(self):
        """What the backend needs before the teardown at interpreter exit."""

    def split(self, ranks, member):
        """A process set's communicator (None on a rank outside `ranks`) and the backend's native handle of it.
        Collective over the world; every rank passes the same ranks."""
        comm = _ctx.comm.split(0 if member else 1, _ctx.rank)
        return (comm if member else None), None

    def gloo(self):
        """Horovod's gloo_enabled(): the collectives run on a gloo process group."""
        return False

    def runtime(self):
        """The fusion runtime, or None on a backend without one."""
        return _ctx.runtime

    def negotiates(self, comp):
        """Whether allreduce(comp, ...) over the world without a scope goes through a runtime that negotiates it (its
        join then serves it; otherwise join_protocol's control round does)."""
        return False

    def allreduce(self, comp, name, flat, step, op, process_set=None, scope=None, stats=None):
        """A compressed allreduce of `flat` in place, over the world or `process_set`'s communicator."""
        comm = _ctx.comm if process_set is None else process_set.communicator()
        result = _C.compressed_allreduce(comm, comp._impl, flat, name, op, step)
        if stats is not None:
            stats.update(result)
        return _Handle()


class _MpiBackend(_Backend):
    name = "mpi"
    over_mpi = True

    def open(self, timeout_s):
        if not _C.has_collectives:
            raise CommError(f"gradcomp.torch.init(backend='{self.name}'): this build of gradcomp has no MPI "
                            "communicator; use backend='torch'")
        _ctx.comm = _C.make_mpi_world_communicator(timeout_s)
        _ctx.control_comm = _ctx.comm
        _ctx.rank, _ctx.size = _ctx.comm.rank, _ctx.comm.size
        if _ctx.size > 1:
            try:
                mailbox = _C.make_mpi_world_mailbox(timeout_s)
            except CommError as e:  # MPI initialized by the caller without MPI_THREAD_MULTIPLE: no join()
                _ctx.notes_missing = str(e)
                return
            _ctx.notes = join_notes.Notes(join_notes.MpiTransport(mailbox), _ctx.rank, _ctx.size, timeout_s)


class _RuntimeHandle:
    def __init__(self, handle, tensor, comp):
        self.handle, self.tensor, self.comp = handle, tensor, comp  # both stay alive until wait()

    def wait(self):
        _ctx.runtime.wait(self.handle)


class _RuntimeBackend(_MpiBackend):
    name = "runtime"

    def open(self, timeout_s):
        if not _C.has_runtime:
            raise CommError("gradcomp.torch.init(backend='runtime'): this build of gradcomp has no fusion runtime; "
                            "use backend='torch'")
        super().open(timeout_s)
        # The runtime owns its communicator; broadcasts and the allreduces it does not take use the world one.
        _ctx.runtime_comm = _ctx.comm.split(0, _ctx.rank)
        _ctx.device_comm = _make_device_comm(_ctx.comm)
        _ctx.runtime = _C.Runtime(_ctx.runtime_comm, default_spec="none", op="average", timeout_s=timeout_s,
                                  device_comm=_ctx.device_comm)

    def close(self):
        _close_notes()
        if _ctx.runtime is not None:
            _ctx.runtime.shutdown()
        _ctx.runtime = None
        _ctx.device_comm = None  # after the runtime that uses it

    def negotiates(self, comp):
        return _registered(comp.spec)

    def allreduce(self, comp, name, flat, step, op, process_set=None, scope=None, stats=None):
        if process_set is not None or (scope is None and not self.negotiates(comp)):
            # The fusion runtime runs on the world: a process set's tensors take its own communicator; so does a
            # Horovod-style codec object passed without an owner (no registered spec the runtime could build).
            return super().allreduce(comp, name, flat, step, op, process_set)
        stream = torch.cuda.current_stream(flat.device).cuda_stream if flat.is_cuda else 0
        if _ctx.notes is not None:
            _ctx.notes.tally()  # orders the joins (join_notes.py): the runtime's join serves this tensor
        # The op travels with the request: the runtime sums a Sum (never an average scaled back, which loses bits)
        # and fuses only requests of the same op.
        if scope is not None:
            handle = _ctx.runtime.allreduce_async(name, flat, stream=stream, op=op, compressor=comp._impl,
                                                  scope=scope, step=step)
        else:
            handle = _ctx.runtime.allreduce_async(name, flat, comp.spec, stream, op=op)
        return _RuntimeHandle(handle, flat, comp)


def _close_notes():
    """Ends join's notes (every rank closes: on gloo each ends the next rank's listener); True when the listener
    ended (its group may then be destroyed)."""
    notes, _ctx.notes = _ctx.notes, None
    if notes is None:
        return True
    try:
        return notes.close()
    except Exception:  # a peer already gone: the listener ends with the process
        return False


def _registered(spec):
    """Whether the runtime can build `spec` from the one registry (a Horovod-style codec object cannot)."""
    name = _C.parse_spec(spec)[0]
    return any(info["name"] == name for info in _C.list_compressors())


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


def _torch_comm(group):
    """A Communicator of its own over the torch group (None: the default group). The Python collectives use it from
    the caller's thread; the exchange worker has another (exchange.exchange_for), so no two threads share one."""
    return _C.TorchCommunicator(exchange.ProcessGroupAdapter(group))


class _TorchBackend(_Backend):
    name = "torch"
    elastic = True

    def open(self, timeout_s):
        if dist.is_initialized():
            _ctx.rank, _ctx.size = dist.get_rank(), dist.get_world_size()
        else:
            _init_process_group(timeout_s)
            _ctx.owns_process_group = True
        _ctx.comm = _torch_comm(None)
        _ctx.control_comm = _ctx.comm
        if _ctx.size > 1:
            # join()'s control rounds on a gloo group of their own, so that they never interleave with the exchange
            # worker's collectives on the default group (which run on another thread).
            _ctx.control_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            _ctx.control_comm = _torch_comm(_ctx.control_group)
            _ctx.notes_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            transport = join_notes.GlooTransport(_ctx.notes_group, _ctx.rank, _ctx.size)
            _ctx.notes = join_notes.Notes(transport, _ctx.rank, _ctx.size, timeout_s)

    def close(self):
        notes_ended = _close_notes()
        groups = [_ctx.control_group] + ([_ctx.notes_group] if notes_ended else [])
        for group in groups:
            if group is None or not dist.is_initialized() or _ctx.owns_process_group:
                continue
            try:
                dist.destroy_process_group(group)
            except Exception:  # torch versions that cannot destroy a subgroup: it ends with the default group
                pass
        if _ctx.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()

    def at_exit(self):
        """Without a last barrier gloo may abort at exit when a peer closes its sockets first."""
        if _ctx.owns_process_group and dist.is_initialized():
            dist.barrier()

    def split(self, ranks, member):
        group = dist.new_group(ranks)  # collective over the world, as torch builds every group
        return (_torch_comm(group) if member else None), (group if member else None)

    def gloo(self):
        return dist.is_initialized() and dist.get_backend() == "gloo"

    def allreduce(self, comp, name, flat, step, op, process_set=None, scope=None, stats=None):
        group = None if process_set is None else process_set._native
        return _Handle(exchange.allreduce_async(comp, flat, name, step, op=op, group=group, stats=stats))


def _init_process_group(timeout_s):
    """torch.distributed's default group from the launcher's environment (mpirun, srun, torchrun)."""
    rank = _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK", default=0)
    size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", default=1)
    local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=size)
    addr = os.environ.get("GRADCOMP_MASTER_ADDR") or os.environ.get("MASTER_ADDR")
    if addr is None:
        if local_size != size:
            raise InvalidArgument("gradcomp.torch.init(): a multi-node job needs MASTER_ADDR (the host of rank 0) in "
                                  "the environment")
        addr = "127.0.0.1"
    pg_backend = "nccl" if (torch.cuda.is_available() and os.environ.get("GRADCOMP_TORCH_PG") != "gloo") else "gloo"
    # GRADCOMP_INIT_METHOD (e.g. file:///shared/path) replaces the TCP rendezvous.
    init_method = os.environ.get("GRADCOMP_INIT_METHOD") or f"tcp://{addr}:{_rendezvous_port()}"
    dist.init_process_group(pg_backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    _ctx.rank, _ctx.size = rank, size


def _rendezvous_port():
    explicit = _env_int("GRADCOMP_MASTER_PORT", "MASTER_PORT")
    if explicit:
        return explicit
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMI_ID")
    if job is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    # 20000-32767: below Linux's ephemeral range (32768-60999), where another process's outgoing connection may hold
    # the port (seen as "Address already in use" between two back-to-back jobs).
    return 20000 + int(hashlib.sha1(job.encode()).hexdigest(), 16) % 12768
