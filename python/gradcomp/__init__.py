"""gradcomp: gradient compression for distributed training.

    import gradcomp
    c = gradcomp.compressor("topk", ratio=0.01)
    payload = c.compress(grad, name="fc1.weight", step=0)
    c.decompress(payload, out)

PyTorch integration lives in :mod:`gradcomp.torch` (DDP comm hook, Horovod-style ``DistributedOptimizer``).
"""
from . import _gradcomp
from ._gradcomp import CommError, CorruptPayload, CudaError, Error, InvalidArgument, Timeout
from ._compressors import (
    Compression,
    CompressionSpec,
    Compressor,
    PythonCompressor,
    compressor,
    list_compressors,
    make_spec,
    register_compressor,
    unregister_compressor,
)

__version__ = "0.1.0"

__all__ = [
    "Error", "InvalidArgument", "CorruptPayload", "CommError", "CudaError", "Timeout",
    "Compression", "CompressionSpec", "Compressor", "PythonCompressor", "compressor", "list_compressors",
    "make_spec", "register_compressor", "unregister_compressor",
]
