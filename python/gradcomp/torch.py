"""PyTorch integration.

DDP comm hook::

    state, hook = gradcomp.torch.ddp_comm_hook("topk:ratio=0.01", model=model)
    ddp_model.register_comm_hook(state, hook)

Horovod-style API (a Horovod script changes only ``import horovod.torch as hvd`` to ``import gradcomp.torch as hvd``)::

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.topk(0.01))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
"""
import atexit
import contextlib
import hashlib
import os
import socket

import torch
import torch.distributed as dist

from . import _gradcomp as _C
from . import _optimizer_state, _torch_comm
from ._compressors import Compression, CompressionSpec, InvalidArgument, compressor, make_spec  # noqa: F401
from ._ddp_hook import HookState, bucket_name, bucket_segments, ddp_comm_hook  # noqa: F401
from ._gradcomp import CommError, Error, Timeout  # noqa: F401

# Reduction ops, as in horovod.torch.
Average = "average"
Sum = "sum"
Adasum = "adasum"


# ---------------------------------------------------------------------------------------------------------------------
# Horovod-style process-wide API
# ---------------------------------------------------------------------------------------------------------------------
class _Context:
    def __init__(self):
        self.backend = None       # "torch" (torch.distributed) or "mpi" (gradcomp's C++ MPI communicator)
        self.comm = None          # C++ communicator for the "mpi" and "runtime" backends
        self.runtime_comm = None  # the runtime's own communicator (a split of comm)
        self.runtime = None       # C++ fusion Runtime for the "runtime" backend
        self.device_comm = None   # the runtime's NCCL communicator for CUDA tensors (None: CUDA tensors use MPI)
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.owns_process_group = False


_ctx = _Context()


def _env_int(*names, default=None):
    for n in names:
        v = os.environ.get(n)
        if v is not None and v != "":
            return int(v)
    return default


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


def init(backend=None, timeout_s=60.0):
    """Initializes gradcomp's process group from the MPI launcher's environment (mpirun, srun) or torchrun's.

    backend: "runtime" (gradcomp's C++ fusion runtime over the MPI communicator), "mpi" (the C++ MPI communicator,
    one compressed_allreduce per gradient), "torch" (torch.distributed: gloo, or NCCL when CUDA is available), or None
    for the default: "runtime" under mpirun when the library has it, else "mpi" when it has the MPI communicator,
    else "torch". The environment variable GRADCOMP_BACKEND overrides the default.
    """
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
            import datetime
            # GRADCOMP_INIT_METHOD (e.g. file:///shared/path) replaces the TCP rendezvous.
            init_method = os.environ.get("GRADCOMP_INIT_METHOD") or f"tcp://{addr}:{port}"
            dist.init_process_group(pg_backend, init_method=init_method, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            _ctx.owns_process_group = True
            _ctx.rank, _ctx.size = rank, size
    else:
        raise InvalidArgument(f"gradcomp.torch.init(): unknown backend '{backend}' (valid: mpi, torch)")
    _ctx.backend = backend
    atexit.register(_shutdown_at_exit)
    _ctx.local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK",
                               default=0 if _ctx.size == 1 else _ctx.rank)
    _ctx.local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE",
                               default=_ctx.size)


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


def _require_init():
    if _ctx.backend is None:
        raise InvalidArgument("gradcomp.torch: call init() first")


def shutdown():
    """Releases the process group (init() may be called again)."""
    _torch_comm.close_all()
    if _ctx.backend == "torch" and _ctx.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()
    if _ctx.runtime is not None:
        _ctx.runtime.shutdown()
    _ctx.runtime = None
    _ctx.device_comm = None  # after the runtime that uses it
    _ctx.__init__()


def is_initialized():
    return _ctx.backend is not None


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
    return _ctx.backend


def _check_op(op, average=None):
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = Average
    if op not in (Average, Sum):
        raise InvalidArgument(f"gradcomp.torch: reduce op '{op}' is not supported (valid: Average, Sum)")
    return op


def allreduce(tensor, average=None, name=None, op=None, compression=None):
    """Returns the average (or sum) of `tensor` over all ranks (uncompressed unless `compression` is given)."""
    _require_init()
    op = _check_op(op, average)
    out = tensor.detach().clone().contiguous()
    if compression is None or compression == Compression.none:
        if _ctx.backend in ("mpi", "runtime"):
            _ctx.comm.allreduce(out.view(-1), op)
        else:
            dist.all_reduce(out)
            if op == Average:
                out.div_(_ctx.size)
        return out
    c = compressor(compression)
    _Backend.get().allreduce(c, name or "allreduce", _exchange_view(out, c), 0, op).wait()
    return out


def _exchange_view(tensor, comp):
    """A contiguous `tensor` as the C++ codecs take it: a matrix of its first dimension's rows when it has two or
    more dimensions (shape-aware codecs such as powersgd compress that matrix), else flat. Python codecs get it
    flat."""
    if tensor.dim() >= 2 and not comp.is_python and tensor.numel() > 0:
        return tensor.view(tensor.shape[0], -1)
    return tensor.view(-1)


def allreduce_(tensor, average=None, name=None, op=None):
    tensor.copy_(allreduce(tensor, average=average, name=name, op=op))
    return tensor


def broadcast_(tensor, root_rank, name=None):
    """In place: every rank's `tensor` becomes root_rank's."""
    _require_init()
    if _ctx.backend in ("mpi", "runtime"):
        if not tensor.is_contiguous():
            raise InvalidArgument(f"broadcast_('{name}'): tensor must be contiguous")
        _ctx.comm.broadcast(tensor.detach().view(-1).view(torch.uint8), root_rank)
    else:
        dist.broadcast(tensor.detach(), root_rank)
    return tensor


def broadcast(tensor, root_rank, name=None):
    return broadcast_(tensor.detach().clone().contiguous(), root_rank, name)


def broadcast_object(obj, root_rank=0, name=None):
    """Pickles `obj` on root_rank and returns it on every rank."""
    _require_init()
    if _ctx.size == 1:
        return obj
    if _ctx.backend == "torch":
        box = [obj]
        dist.broadcast_object_list(box, src=root_rank)
        return box[0]
    import pickle
    data = pickle.dumps(obj) if _ctx.rank == root_rank else b""
    length = torch.tensor([len(data)], dtype=torch.int64)
    broadcast_(length, root_rank)
    buf = torch.zeros(int(length.item()), dtype=torch.uint8)
    if _ctx.rank == root_rank:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    broadcast_(buf, root_rank)
    return pickle.loads(buf.numpy().tobytes())


def broadcast_parameters(params, root_rank=0):
    """Broadcasts a model's ``state_dict()`` or ``named_parameters()`` from root_rank (as horovod.torch does)."""
    _require_init()
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise InvalidArgument("broadcast_parameters: pass model.state_dict() or model.named_parameters()")
    else:
        raise InvalidArgument(f"broadcast_parameters: invalid params of type {type(params).__name__}")
    with torch.no_grad():
        for name, p in items:
            if torch.is_tensor(p):
                broadcast_(p, root_rank, name)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Makes every rank's optimizer state (hyper-parameters, momenta, gradcomp compressor state) root_rank's."""
    _require_init()
    if _ctx.size == 1:
        return
    state = optimizer.state_dict() if _ctx.rank == root_rank else None
    if state is not None:
        # gradcomp's state (residuals, the runtime's) is per rank and refuses to load on another: each keeps its own.
        state = {k: v for k, v in state.items() if k != "gradcomp"}
    state = broadcast_object(state, root_rank)
    if _ctx.rank != root_rank:
        optimizer.load_state_dict(state)


# ---------------------------------------------------------------------------------------------------------------------
# Backends of DistributedOptimizer: torch.distributed (the C++ algorithms over the process group, as the hook) or
# gradcomp's C++ MPI collectives / fusion runtime
# ---------------------------------------------------------------------------------------------------------------------
class _Handle:
    def __init__(self, fut=None):
        self.fut = fut

    def wait(self):
        if self.fut is not None:
            self.fut.wait()


class _Backend:
    _instance = None

    @staticmethod
    def get():
        if _Backend._instance is None or _Backend._instance.kind != _ctx.backend:
            _Backend._instance = {"mpi": _MpiBackend, "runtime": _RuntimeBackend,
                                  "torch": _TorchBackend}[_ctx.backend]()
        return _Backend._instance


class _TorchBackend(_Backend):
    kind = "torch"

    def allreduce(self, comp, name, flat, step, op):
        return _Handle(_torch_comm.allreduce_async(comp, flat, name, step, op=op))


class _RuntimeHandle:
    def __init__(self, handle, tensor, scale):
        self.handle, self.tensor, self.scale = handle, tensor, scale  # the tensor stays alive until wait()

    def wait(self):
        _ctx.runtime.wait(self.handle)
        if self.scale != 1:
            self.tensor.mul_(self.scale)


class _RuntimeBackend(_Backend):
    kind = "runtime"

    def allreduce(self, comp, name, flat, step, op):
        if comp.is_python:
            return _MpiBackend.python_allreduce(comp, name, flat, op)
        stream = torch.cuda.current_stream(flat.device).cuda_stream if flat.is_cuda else 0
        handle = _ctx.runtime.allreduce_async(name, flat, comp.spec, stream)
        return _RuntimeHandle(handle, flat, _ctx.size if op == Sum else 1)


class _MpiBackend(_Backend):
    kind = "mpi"

    @staticmethod
    def python_allreduce(comp, name, flat, op):
        comp.allreduce(flat, [(name, 0, flat.numel())], op, _ctx.size,
                       lambda payload: _ctx.comm.allreduce(payload, "sum"))
        return _Handle()

    def allreduce(self, comp, name, flat, step, op):
        if comp.is_python:
            return _MpiBackend.python_allreduce(comp, name, flat, op)
        _C.compressed_allreduce(_ctx.comm, comp._impl, flat, name, op, step)
        return _Handle()


# ---------------------------------------------------------------------------------------------------------------------
# DistributedOptimizer
# ---------------------------------------------------------------------------------------------------------------------
class _DistributedOptimizer(torch.optim.Optimizer):
    def _gradcomp_setup(self, named_parameters, compression, backward_passes_per_step, op):
        _require_init()
        self._op = _check_op(op)
        self._compression = compression
        self._compressor = compressor(compression)
        self._backward_passes_per_step = int(backward_passes_per_step)
        if self._backward_passes_per_step < 1:
            raise InvalidArgument(f"DistributedOptimizer: backward_passes_per_step must be >= 1, got "
                                  f"{backward_passes_per_step}")
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise InvalidArgument("DistributedOptimizer: named_parameters has duplicate names")
            self._names = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(all_params) if id(p) not in self._names]
            if missing:
                raise InvalidArgument(f"DistributedOptimizer: {len(missing)} optimizer parameters are missing from "
                                      "named_parameters")
        else:
            self._names = {}
            for gi, group in enumerate(self.param_groups):
                for pi, p in enumerate(group["params"]):
                    self._names[id(p)] = f"allreduce.noname.{gi}.{pi}"
        self._step_count_gc = 0
        self._handles = {}
        self._passes = {}
        self._should_sync = True
        self._synchronized = False
        self._hook_handles = []
        self._grad_accs = []
        if _ctx.size > 1 or os.environ.get("GRADCOMP_FORCE_HOOKS"):
            self._register_hooks()

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                if hasattr(p, "register_post_accumulate_grad_hook"):
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_post_hook(p)))
                else:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._hook_handles.append(acc.register_hook(self._make_acc_hook(p)))
                    self._grad_accs.append(acc)

    def _remove_hooks(self):
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        self._grad_accs = []

    def _make_acc_hook(self, p):
        def hook(*_):
            self._on_grad(p)
        return hook

    def _make_post_hook(self, p):
        def hook(_):
            self._on_grad(p)
        return hook

    def _on_grad(self, p):
        if p.grad is None:
            return
        if id(p) in self._handles and self._handles[id(p)] is not None:
            raise Error(f"gradcomp DistributedOptimizer: gradient of '{self._names[id(p)]}' computed twice before "
                        "step(); use backward_passes_per_step or optimizer.synchronize()")
        passes = self._passes.get(id(p), 0) + 1
        self._passes[id(p)] = passes
        if passes < self._backward_passes_per_step:
            return
        self._handles[id(p)] = self._allreduce_grad(p)

    def _allreduce_grad(self, p):
        self._passes[id(p)] = 0
        grad = p.grad
        if self._backward_passes_per_step > 1:
            grad.div_(self._backward_passes_per_step)
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        return _Backend.get().allreduce(self._compressor, self._names[id(p)], _exchange_view(grad, self._compressor),
                                        self._step_count_gc, self._op)

    def synchronize(self):
        """Waits for every gradient's allreduce (launching those whose hooks did not fire)."""
        if _ctx.size > 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad and p.grad is not None and self._handles.get(id(p)) is None:
                        self._handles[id(p)] = self._allreduce_grad(p)
            for h in self._handles.values():
                if h is not None:
                    h.wait()
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, step() does not synchronize (call synchronize() yourself first, e.g. for gradient clipping)."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._should_sync:
            if self._synchronized and not self._handles:
                pass  # synchronize() was called explicitly
            else:
                self.synchronize()
        self._synchronized = False
        self._step_count_gc += 1
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise Error("gradcomp DistributedOptimizer: zero_grad() called between backward() and step(); call "
                        "step() or synchronize() first")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def state_dict(self):
        """The wrapped optimizer's state plus "gradcomp": this rank's compressor state (see _optimizer_state.save)."""
        sd = super(self.__class__, self).state_dict()
        sd["gradcomp"] = _optimizer_state.save(self, _ctx)
        return sd

    def load_state_dict(self, state_dict):
        """Restores this rank's own state_dict(); a failed load changes nothing (see _optimizer_state.load)."""
        state_dict = dict(state_dict)
        gc = state_dict.pop("gradcomp", None)
        load_wrapped = lambda: super(self.__class__, self).load_state_dict(state_dict)  # noqa: E731
        if gc is None:
            load_wrapped()
        else:
            _optimizer_state.load(self, gc, _ctx, load_wrapped)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, **_horovod_only):
    """Wraps `optimizer` so that step() applies gradients averaged over all ranks, each compressed with
    `compression` (``gradcomp.Compression.topk(0.01)``, ``Compression.fp16``, a spec string or a Python-registered
    codec). The returned object is an instance of the original optimizer's class (as in horovod.torch) and its
    state_dict() includes the compressor state (residuals), so checkpoint/resume reproduces the uninterrupted run.
    """
    if gradient_predivide_factor != 1.0:
        raise InvalidArgument("DistributedOptimizer: gradient_predivide_factor is not supported")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._gradcomp_setup(named_parameters, compression, backward_passes_per_step, op)
    return wrapped
