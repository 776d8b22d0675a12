"""Python codecs (Horovod's compressor shape) in the one C++ registry: register_compressor adds a kind whose factory
builds the Python object, and the C++ adapter (python/src/python_codec.h) makes it a Compressor that every component
reduces, the fusion runtime included."""
import atexit
import inspect
import threading

from . import _gradcomp as _C
from ._compressors import _NAME_RE, Compressor, _C_knows
from ._gradcomp import InvalidArgument

_lock = threading.Lock()

# The Python codec kinds this process registered (name -> class or object), for list_compressors()' "python" flag and
# the cleanup at exit; the C++ registry is the one that builds them.
registered = {}


class PythonCompressor(Compressor):
    """A Python codec with Horovod's compressor shape: ``compress(tensor) -> (payload, ctx)`` and
    ``decompress(payload, ctx) -> tensor``, seen by C++ as a Compressor of the one registry: compressed_allreduce,
    the fusion runtime, the DDP hook and DistributedOptimizer reduce it with the "rounds" algorithm, Horovod's
    combination (every rank's payload summed, divided by the world size for an average when floating point, decoded
    with the local ctx), per named tensor. ``compress``/``decompress`` here call the Python object itself; its
    ``state_dict()`` (when it has one) is part of the compressor's state.
    """

    is_python = True

    def __init__(self, impl):
        self._init(impl)  # the C++ Compressor over the Python object
        self._object = _C.python_codec_object(impl)

    def compress(self, tensor, name="tensor", step=0, **_ignored):
        return self._object.compress(tensor)

    def decompress(self, payload, ctx):
        return self._object.decompress(payload, ctx)

    def __repr__(self):
        return f"gradcomp.PythonCompressor('{self.spec}', {self._object!r})"


def _instantiate(name, cls, params):
    if isinstance(cls, type):
        try:
            return cls(**params)
        except TypeError:
            if params:
                raise InvalidArgument(f"compressor '{name}': {cls.__name__}() does not take parameters "
                                      f"{sorted(params)}") from None
            return cls  # static methods only (Horovod style)
    if params:
        raise InvalidArgument(f"compressor '{name}' is a registered instance and takes no parameters")
    return cls


def _params(values):
    """Keyword arguments of a Python codec from the spec's values (str): numbers become int or float."""
    params = {}
    for k, v in values.items():
        for conv in (int, float):
            try:
                v = conv(v)
                break
            except ValueError:
                pass
        params[k] = v
    return params


def register_compressor(name, cls):
    """Makes a Python codec usable wherever a built-in one is: it joins the one C++ registry, so ``compressor(name)``,
    C++'s ``make_compressor`` and spec parser, the DDP hook, DistributedOptimizer and the fusion runtime build it.

    ``cls`` is a class (instantiated with the spec's parameters, or used as is when its methods are static, as in
    Horovod) or an instance with ``compress(tensor) -> (payload, ctx)`` and ``decompress(payload, ctx)``.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidArgument(f"register_compressor: name '{name}' must match [a-z0-9_]+")
    for method in ("compress", "decompress"):
        if not callable(getattr(cls, method, None)):
            raise InvalidArgument(f"register_compressor('{name}'): {cls!r} has no {method}() method (Horovod shape: "
                                  "compress(tensor) -> (payload, ctx), decompress(payload, ctx) -> tensor)")
    with _lock:
        if _C_knows(name):
            raise InvalidArgument(f"register_compressor: '{name}' is already registered")
        _C.register_python_codec(name, lambda values: _instantiate(name, cls, _params(values)),
                                 (inspect.getdoc(cls) or "").split("\n")[0])
        registered[name] = cls


def unregister_compressor(name):
    """Removes a Python-registered codec from the registry (a built-in or C++ kind: InvalidArgument)."""
    with _lock:
        _C.unregister_python_codec(name)
        registered.pop(name, None)


@atexit.register
def _unregister_all():
    """Before the interpreter goes: the registry's entries hold Python objects."""
    for name in list(registered):
        unregister_compressor(name)
