"""Compressor objects (C++ codecs and Python-registered ones), spec strings and the Horovod-style Compression names."""
import itertools
import re

import numpy as _np

from . import _gradcomp as _C
from . import _state
from ._gradcomp import InvalidArgument

# Size of the payload header that precedes section 0 (the dense body of a summable codec); see compressors/framework/payload.h.
PAYLOAD_HEADER_BYTES = 64

# The documented rule for codec names, ASCII only (str.islower() would let "ñame" through).
_NAME_RE = re.compile(r"[a-z0-9_]+", re.ASCII)

# Each compressor object's agreement scope (see gradcomp.torch.exchange.allreduce_async): the exchanges of one hook
# state or optimizer are checked across ranks once per layout.
_agreement_scopes = itertools.count(1)


def _format_value(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def make_spec(spec, **params):
    """``make_spec("topk", ratio=0.01) == "topk:ratio=0.01"``; params given here override those in ``spec``."""
    if isinstance(spec, CompressionSpec):
        spec = spec.spec
    if not isinstance(spec, str):
        raise InvalidArgument(f"a compressor spec must be a string such as 'topk:ratio=0.01', got {type(spec).__name__}")
    if not params:
        return spec
    name, pairs = _C.parse_spec(spec)  # the one spec parser (C++), also for Python-registered names
    merged = dict(pairs)
    for k, v in params.items():
        merged[k] = _format_value(v)
    return name + ":" + ",".join(f"{k}={v}" for k, v in merged.items())


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _stream_of(tensor):
    if _is_torch(tensor) and tensor.is_cuda:
        import torch
        return torch.cuda.current_stream(tensor.device).cuda_stream
    return 0


def _as_array(x, what):
    """Something DLPack-capable: torch tensors are detached; bytes become a read-only uint8 NumPy array."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return _np.frombuffer(x, dtype=_np.uint8)
    if _is_torch(x):
        return x.detach()
    if isinstance(x, _np.ndarray):
        return x
    raise InvalidArgument(f"{what}: expected a torch tensor, a NumPy array or bytes, got {type(x).__name__}")


class Compressor:
    """A C++ codec (built-in or registered in C++) with its per-tensor error-feedback state.

    Not thread-safe: use one instance per thread or serialize calls.
    """

    def __init__(self, spec, **params):
        self._init(_C.make_compressor(make_spec(spec, **params)))

    def _init(self, impl):
        self._impl = impl
        self._buffers = {}
        self.agreement_scope = next(_agreement_scopes)

    @property
    def name(self):
        return self._impl.name

    @property
    def spec(self):
        return self._impl.spec

    @property
    def traits(self):
        return self._impl.traits

    is_python = False

    def max_payload_bytes(self, numel):
        return self._impl.max_payload_bytes(numel)

    def compress(self, tensor, name="tensor", step=0, rank=0, world_size=1, prescale=1.0, out=None):
        """Compresses ``tensor`` (float32/16, bfloat16; CPU or CUDA; contiguous) under the stable ``name``.

        Returns the payload: a uint8 torch tensor on the tensor's device for torch input, a uint8 NumPy array for
        NumPy input (a view of ``out`` when given).
        """
        src = _as_array(tensor, f"compress('{name}')")
        numel = int(src.numel()) if _is_torch(src) else int(src.size)
        cap = self._impl.max_payload_bytes(numel)
        if out is None:
            if _is_torch(src):
                import torch
                out = torch.empty(cap, dtype=torch.uint8, device=src.device)
            else:
                out = _np.empty(cap, dtype=_np.uint8)
        size = self._impl.compress_into(src, out, name, step, rank, world_size, prescale, _stream_of(src))
        return out[:size]

    def decompress(self, payload, out, accumulate=False):
        """Decodes ``payload`` into ``out`` (same numel and dtype as compressed); adds to it when accumulate=True.

        A truncated or damaged payload raises gradcomp.CorruptPayload and leaves ``out`` untouched.
        """
        p = _as_array(payload, "decompress() payload")
        o = out.detach() if _is_torch(out) else out
        self._impl.decompress_into(p, o, accumulate, _stream_of(o))
        return out

    def last_stats(self):
        return self._impl.last_stats()

    def set_threads(self, threads):
        self._impl.set_threads(threads)

    def reset_state(self):
        self._impl.reset_state()

    def state_dict(self):
        """Every tensor's residuals, momenta and step counters in a checksummed envelope (``_state.seal``: format
        version, spec, checksum; kind "compressor")."""
        return _state.seal("compressor", self.spec, self._state_bytes())

    def load_state_dict(self, state):
        """Restores a ``state_dict()``: damaged bytes raise CorruptPayload, another codec's state InvalidArgument;
        either way nothing changes."""
        data, _ = _state.open_state(state, "compressor", self.spec, where=f"{self!r}.load_state_dict")
        self._load_state_bytes(data)

    def _state_bytes(self):
        return self._impl.save_state()

    def _load_state_bytes(self, data):
        self._impl.load_state(data)  # all or nothing (the C++ codec swaps its state in only once it parsed)

    def __repr__(self):
        return f"gradcomp.Compressor('{self.spec}')"


def _C_knows(name):
    return any(info["name"] == name for info in _C.list_compressors())


def compressor(spec, **params):
    """A new compressor from a spec (``"topk:ratio=0.01"``, ``"qsgd"``, ``"myq:bits=4"``, ...) and keyword parameters.

    Every name is looked up in the one C++ registry (built-ins, C++ and Python registrations); a Python codec comes
    back as a PythonCompressor. A bad spec raises gradcomp.InvalidArgument whose message lists the valid names or
    parameters.
    """
    if isinstance(spec, Compressor):
        return spec
    if _is_horovod_style(spec):
        if params:
            raise InvalidArgument(f"compressor({spec!r}): a Horovod-style compressor object takes no parameters")
        # Passed directly, as in Horovod (compression=MyCompressor): used as is, never instantiated.
        return PythonCompressor(_C.wrap_python_codec(_horovod_name(spec), spec))
    return _wrap(_C.make_compressor(make_spec(spec, **params)))


def _wrap(impl):
    """The Python object of a C++ Compressor: a PythonCompressor over a Python codec, else a Compressor."""
    if _C.python_codec_object(impl) is not None:
        return PythonCompressor(impl)
    c = Compressor.__new__(Compressor)
    c._init(impl)
    return c


def owned_compressor(spec, **params):
    """compressor(spec, **params) for an owner of compressor state (an optimizer, a hook): a gradcomp Compressor
    object passed in is not shared but copied from its spec (a fresh instance, no state), so two owners given the same
    object never see each other's residuals. Python codecs are used as given (Horovod's semantics)."""
    if isinstance(spec, Compressor) and not spec.is_python:
        return Compressor(spec.spec, **params)
    return compressor(spec, **params)


def _is_horovod_style(obj):
    """A class or object with Horovod's compressor methods that is not a gradcomp spec (Compression.none/fp16 are
    specs with those methods: they keep the C++ codecs)."""
    return (not isinstance(obj, (str, CompressionSpec)) and callable(getattr(obj, "compress", None))
            and callable(getattr(obj, "decompress", None)))


def _horovod_name(obj):
    cls = obj if isinstance(obj, type) else type(obj)
    return "python_" + re.sub(r"[^a-z0-9_]", "_", f"{cls.__module__}_{cls.__qualname__}".lower())


def list_compressors():
    """Every compressor kind of the one registry: dicts with name, summary, traits, params (built-ins, then C++ and
    Python registrations in registration order); Python codecs also carry "python": True."""
    out = list(_C.list_compressors())
    for info in out:
        if info["name"] in _python_codecs.registered:
            info["python"] = True
    return out


class CompressionSpec:
    """A compression choice for DistributedOptimizer / the DDP hook: usable as is (``Compression.fp16``) or called
    with parameters (``Compression.topk(0.01)``, ``Compression.qsgd(bits=4)``)."""

    def __init__(self, spec):
        self.spec = spec

    def __call__(self, *args, **params):
        name = _C.parse_spec(self.spec)[0]
        if args:
            # The parameter a positional argument means (Compression.topk(0.01), Compression.qsgd(4)): from the
            # codec table, through the registry.
            positional = _C.compressor_info(name)["positional"] if _C_knows(name) else ""
            if len(args) > 1 or not positional:
                raise InvalidArgument(f"Compression.{name}: pass parameters by keyword, e.g. "
                                      f"Compression.{name}(ratio=0.01)")
            params = {positional: args[0], **params}
        return CompressionSpec(make_spec(self.spec, **params))

    def __repr__(self):
        return f"Compression('{self.spec}')"

    def __eq__(self, other):
        return isinstance(other, CompressionSpec) and other.spec == self.spec

    def __hash__(self):
        return hash(self.spec)


class HorovodCompressor:
    """Horovod's compressor interface (``horovod.torch.compression.Compressor``): ``compress(tensor) -> (tensor,
    ctx)`` and ``decompress(tensor, ctx) -> tensor``. Subclass it, or write any class or object with those two methods,
    and pass it as ``compression=`` (used as is, as Horovod does: every rank's compressed tensor is averaged, then
    decompressed with the local ctx)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(CompressionSpec, HorovodCompressor):
    """``Compression.none``: Horovod's NoneCompressor (``compress`` returns the tensor unchanged, from
    HorovodCompressor) that is also the spec "none" (the optimizer and the hook run the C++ "none" codec for it)."""

    def __init__(self):
        super().__init__("none")


class FP16Compressor(CompressionSpec):
    """``Compression.fp16``: Horovod's FP16Compressor (floating tensors cast to float16, back to their dtype on
    decompress) that is also the spec "fp16" (the C++ codec: saturating, never a silent inf)."""

    def __init__(self):
        super().__init__("fp16")

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(_torch().float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


def _torch():
    import torch
    return torch


class _CompressionNames(type):
    """Every registered compressor (C++ codec table or Python registration) is an attribute of Compression, so the
    list of names exists once, in the registry: ``Compression.powersgd(4)``, ``Compression.qsgd(bits=4)``."""

    def __getattr__(cls, name):
        if not name.startswith("_") and _C_knows(name):
            return CompressionSpec(name)
        raise AttributeError(f"Compression has no compressor '{name}' (registered: "
                             f"{', '.join(c['name'] for c in list_compressors())})")

    def __dir__(cls):
        return sorted(set(super().__dir__()) | {c["name"] for c in list_compressors()})


class Compression(metaclass=_CompressionNames):
    """Horovod-style names: ``compression=gradcomp.Compression.topk(0.01)``, ``Compression.fp16``, ... — one per
    registered compressor. ``none`` and ``fp16`` are also Horovod compressor objects (``Compression.fp16.compress(t)
    -> (t16, ctx)``)."""
    none = NoneCompressor()
    fp16 = FP16Compressor()

    @staticmethod
    def custom(name, **params):
        """A registered (C++ or Python) compressor by name."""
        return CompressionSpec(make_spec(name, **params))


# The Python codecs' half (a module of its own; it subclasses Compressor, so it comes after it).
from . import _python_codecs  # noqa: E402
from ._python_codecs import PythonCompressor, register_compressor, unregister_compressor  # noqa: E402,F401
