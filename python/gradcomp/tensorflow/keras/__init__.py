"""Keras 3 (tf.keras on TensorFlow >= 2.16) integration, Horovod's horovod.tensorflow.keras API::

    import gradcomp.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()), compression=hvd.Compression.fp16)
    model.compile(loss=..., optimizer=opt)
    model.fit(..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""
import keras

from ..._compressors import Compression
from .. import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_object, allreduce, alltoall, barrier,
                broadcast, broadcast_object, broadcast_variables, cross_rank, cross_size, init, is_initialized,
                local_rank, local_size, rank, shutdown, size)
from . import callbacks
from .optimizer import DistributedOptimizer, _Settings, distributed_class


def broadcast_global_variables(root_rank):
    raise NotImplementedError("broadcast_global_variables is TensorFlow 1's; use "
                              "callbacks.BroadcastGlobalVariablesCallback or broadcast_variables")


def _optimizer_classes():
    import inspect
    return {n: c for n, c in inspect.getmembers(keras.optimizers, inspect.isclass)
            if issubclass(c, keras.optimizers.Optimizer) and c is not keras.optimizers.Optimizer}


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, **kwargs):
    """keras.models.load_model(filepath) whose optimizer comes back as a DistributedOptimizer (with `compression`)
    of its class, its saved state restored. custom_optimizers: extra optimizer classes the file may name."""
    classes = _optimizer_classes()
    for cls in custom_optimizers or []:
        classes[cls.__name__] = cls
    settings = _Settings(compression=compression)
    objects = {n: distributed_class(c, settings) for n, c in classes.items()}
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects, **kwargs)


__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
           "cross_size", "Average", "Sum", "Adasum", "Min", "Max", "Product", "allreduce", "allgather", "broadcast",
           "alltoall", "barrier", "broadcast_variables", "broadcast_object", "allgather_object",
           "DistributedOptimizer", "Compression", "callbacks", "load_model", "broadcast_global_variables"]
