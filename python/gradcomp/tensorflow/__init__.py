"""TensorFlow 2 integration, Horovod's horovod.tensorflow API (a Horovod script changes only its import line)::

    import gradcomp.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.topk(0.01))
    grads = tape.gradient(loss, model.trainable_variables)

Tensors reach the C++ collectives, codecs and fusion runtime through DLPack (tensors.py); inside a tf.function
each collective is one py_function node. Keras: gradcomp.tensorflow.keras. Modules, each importing only those above
it: context, launch, tensors, eager_ops, owners, collectives, gradients, functions, tape.
"""
from .. import _gradcomp as _C
from .._compressors import Compression, CompressionSpec, InvalidArgument
from .._gradcomp import CommError, Error, Timeout
from .context import (Adasum, Average, Max, Min, Product, Sum, backend, cross_rank, cross_size, is_homogeneous,
                      is_initialized, local_rank, local_size, rank, size)
from .launch import init, shutdown
from .collectives import (ProcessSet, allgather, allreduce, alltoall, barrier, broadcast, broadcast_,
                          global_process_set, grouped_allgather, grouped_allreduce, join)
from .functions import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables
from .tape import DistributedGradientTape


def mpi_built():
    return bool(_C.has_collectives)


def gloo_built():
    """gloo comes from torch.distributed (backend "torch"), when PyTorch is importable."""
    try:
        import torch.distributed as dist
        return dist.is_gloo_available()
    except ImportError:
        return False


def nccl_built():
    return bool(_C.has_nccl)


cuda_built = nccl_built  # the module has no separate CUDA flag


def rocm_built(): return False  # noqa: E704
ddl_built = ccl_built = rocm_built


def mpi_enabled():
    return backend() in ("mpi", "runtime")


def gloo_enabled():
    return backend() == "torch"


mpi_threads_supported = mpi_enabled


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "is_homogeneous", "backend", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall",
    "barrier", "join", "broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object",
    "DistributedGradientTape", "Compression", "CompressionSpec", "ProcessSet", "global_process_set",
    "mpi_built", "gloo_built", "nccl_built", "cuda_built", "rocm_built", "ddl_built", "ccl_built", "mpi_enabled",
    "gloo_enabled", "mpi_threads_supported", "Error", "InvalidArgument", "CommError", "Timeout",
]
