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

The package's modules, each importing only those above it (no cycles):

- ``context``: the process context (backend, communicators, rank, size), its queries, the reduce ops;
- ``exchange``: torch.distributed under the C++ collectives (the process group's communicator and worker);
- ``launch``: ``init()`` / ``shutdown()``, the rendezvous;
- ``backends``: one tensor's compressed allreduce on the torch, mpi or runtime backend;
- ``collectives``: ``allreduce``, ``broadcast*``;
- ``optimizer``: ``DistributedOptimizer``;
- ``compressed_adam``: ``CompressedAdam`` (Adam/AdamW/LAMB compressing the momentum; ``adam_math``, its arithmetic);
- ``hook``: the DDP communication hook;
- ``elastic``: ``run``, ``TorchState``, ``ElasticSampler`` (horovod.torch.elastic on torchrun's elastic agent).
"""
from .. import _gradcomp as _C  # noqa: F401  (read as gradcomp.torch._C by bench/accuracy)
from .._compressors import Compression, CompressionSpec, InvalidArgument, compressor, make_spec
from .._gradcomp import CommError, Error, Timeout
from .collectives import (allreduce, allreduce_, allreduce_async, allreduce_async_, barrier, grouped_allreduce,
                          grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, join, poll,
                          synchronize)
from .errors import HorovodInternalError, HostsUpdatedInterrupt
from .gathers import (allgather, allgather_async, alltoall, alltoall_async, broadcast, broadcast_, broadcast_async,
                      broadcast_async_, grouped_allgather, grouped_allgather_async, grouped_reducescatter,
                      grouped_reducescatter_async, reducescatter, reducescatter_async, sparse_allreduce_async)
from .objects import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .topology import (ccl_built, check_extension, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                       gloo_enabled,
                       is_homogeneous, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rocm_built,
                       start_timeline, stop_timeline)
from .context import (Adasum, Average, Max, Min, Product, Sum, _check_op, _ctx, backend,  # noqa: F401
                      is_initialized, local_rank, local_size, rank, size)
from .hook import HookState, bucket_name, bucket_segments, ddp_comm_hook
from .backends import _rendezvous_port  # noqa: F401
from .launch import init, shutdown
from .optimizer import DistributedOptimizer
from .compressed_adam import CompressedAdam
from .adam_math import AutoWarmup, VarianceSchedule
from .sync_batch_norm import SyncBatchNorm
from . import elastic  # noqa: E402  (hvd.elastic.run, TorchState, ElasticSampler: issue 18)
from . import compression, functions, mpi_ops  # noqa: E402,F401  (Horovod's submodule names: issue 19)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "backend",
    "Average", "Sum", "Adasum",
    "allreduce", "allreduce_", "broadcast", "broadcast_", "broadcast_object", "broadcast_parameters",
    "broadcast_optimizer_state",
    "DistributedOptimizer", "SyncBatchNorm", "Compression", "CompressionSpec", "compressor", "make_spec",
    "HookState", "ddp_comm_hook", "bucket_name", "bucket_segments",
    "Error", "InvalidArgument", "CommError", "Timeout",
]
__all__ += ["CompressedAdam", "AutoWarmup", "VarianceSchedule"]  # momentum compression for Adam (issue 32)
# Horovod API parity (issue 19): collectives, topology, process sets, utilities.
__all__ += [
    "Min", "Max", "Product",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async", "join", "barrier", "poll",
    "synchronize", "allgather_object",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_built", "nccl_built", "gloo_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "mpi_enabled", "gloo_enabled", "mpi_threads_supported", "start_timeline",
    "stop_timeline",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "HorovodInternalError", "HostsUpdatedInterrupt", "check_extension",
]
