"""Owners of compressor state in gradcomp.tensorflow (docs/architecture.md, "Owners and scopes").

Each owner has its own compressor instance (a copy made from the `compression` spec, never shared with another owner
even when both were given the same object), its own runtime scope (so the runtime negotiates "[scope]name" and never
fuses two owners' tensors together) and its own codec step counter.

A Keras DistributedOptimizer is one owner for its lifetime. A DistributedGradientTape is usually created anew every
step (Horovod's idiom, often inside a tf.function that is traced more than once), so the owner of a tape's state is
the thing that persists: the variables it differentiates, with the compression spec. Every tape over the same
variables with the same spec continues the same residuals and steps; tapes over other variables (a GAN's generator
and discriminator) never meet. A tape whose sources are not all variables owns its state alone."""
import weakref

from .._compressors import Compressor, InvalidArgument, PythonCompressor, owned_compressor
from .context import new_scope


def is_horovod_codec(compression):
    """A Horovod-style compressor class or object (compress(t) -> (t, ctx), decompress(t, ctx)) that is not a gradcomp
    spec: used as is, around an uncompressed allreduce, as Horovod does."""
    return compression is not None and not isinstance(compression, (str, Compressor)) \
        and hasattr(compression, "compress") and hasattr(compression, "decompress") \
        and not hasattr(compression, "spec")


class Owner:
    """One owner's compressor copy, scope and step."""

    def __init__(self, kind, compression):
        self.horovod_codec = compression if is_horovod_codec(compression) else None
        self.compressor = None
        if self.horovod_codec is None:
            self.compressor = owned_compressor(compression if compression is not None else "none")
            if isinstance(self.compressor, PythonCompressor):
                raise InvalidArgument(f"gradcomp.tensorflow: the Python codec '{self.compressor.name}' runs on torch "
                                      "tensors; the TensorFlow binding takes the C++ codecs (Compression.*) or a "
                                      "Horovod-style compressor class working on tf.Tensor")
        self.scope = new_scope(kind)
        self.step = 0


def _spec_key(compression):
    if compression is None or isinstance(compression, str):
        return compression or "none"
    spec = getattr(compression, "spec", None)
    return spec if isinstance(spec, str) else ("object", id(compression))


_by_variables = {}  # (kind, spec key, variable ids) -> (weak references to the variables, Owner)


def owner_for_variables(kind, compression, variables):
    """The owner of `variables` (a list of tf.Variable) under `compression`: created on first use, in the same order
    on every rank. None when some source is not a variable (the caller then owns a state of its own)."""
    try:
        refs = [weakref.ref(v) for v in variables]
    except TypeError:
        return None
    if not variables or not all(hasattr(v, "assign") for v in variables):
        return None
    key = (kind, _spec_key(compression), tuple(id(v) for v in variables))
    entry = _by_variables.get(key)
    if entry is not None and all(r() is v for r, v in zip(entry[0], variables)):
        return entry[1]
    owner = Owner(kind, compression)
    _by_variables[key] = (refs, owner)
    return owner


def reset():
    """Forgets every owner (shutdown(): scopes restart at 0 with the next init())."""
    _by_variables.clear()
