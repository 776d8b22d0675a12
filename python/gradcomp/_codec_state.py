"""A read-only view of a C++ codec's state bytes (``Compressor._state_bytes()``: compressors/framework/state_io.h's "GCST"
envelope: u32 magic, u16 version, codec name, u64 record count, then per tensor: name, numel, steps, float buffers,
double scalars; little-endian). The codec itself loads them; this reader exists so that Python can say what a state
holds without loading it: which tensors, how many values, and the residual's size and norm (buffer 0 of an
error-feedback codec), as gradcomp.torch.elastic reports when a rank's residual is dropped."""
import math
import struct

import numpy

from ._gradcomp import CorruptPayload

_MAGIC = 0x54534347  # "GCST"
_VERSION = 1


class TensorRecord:
    """One tensor's saved state: `name`, `numel`, `steps`, `buffer_sizes` (float values per buffer), `norms` (L2 norm
    of each buffer)."""

    def __init__(self, name, numel, steps, buffer_sizes, norms):
        self.name, self.numel, self.steps = name, numel, steps
        self.buffer_sizes, self.norms = buffer_sizes, norms

    @property
    def residual_bytes(self):
        """Bytes of buffer 0 (the error-feedback residual of the EF codecs), 0 when there is none."""
        return 4 * self.buffer_sizes[0] if self.buffer_sizes else 0

    @property
    def residual_norm(self):
        return self.norms[0] if self.norms else 0.0


class _Reader:
    def __init__(self, data, what):
        self.data, self.offset, self.what = memoryview(data), 0, what

    def take(self, n):
        if n > len(self.data) - self.offset:
            raise CorruptPayload(f"corrupt {self.what}: needs {n} more bytes at offset {self.offset} but only "
                                 f"{len(self.data) - self.offset} are left")
        view = self.data[self.offset:self.offset + n]
        self.offset += n
        return view

    def get(self, fmt):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def get_string(self):
        return bytes(self.take(self.get("Q"))).decode(errors="replace")


def _norm(view):
    """L2 norm of little-endian float32 values (accumulated in float64)."""
    values = numpy.frombuffer(view, dtype="<f4")
    return math.sqrt(float(numpy.dot(values.astype(numpy.float64), values.astype(numpy.float64))))


def read_records(data, what="compressor state"):
    """The TensorRecords of codec state bytes; [] for an empty state (a Python codec without state). A damaged state
    raises CorruptPayload. Only the envelope's own structure is read, so PowerSGD's records (same envelope, other
    buffers) read as well; their buffer 0 is then not a residual."""
    if not data:
        return []
    r = _Reader(bytes(data), what)
    if r.get("I") != _MAGIC:
        return []  # not a C++ codec's state (a Python codec's pickled state_dict): nothing to report
    version = r.get("H")
    if version != _VERSION:
        raise CorruptPayload(f"{what}: version {version}, this reader reads {_VERSION}")
    r.get_string()  # codec name
    records = []
    for _ in range(r.get("Q")):
        name = r.get_string()
        numel, steps, buffers = r.get("Q"), r.get("Q"), r.get("Q")
        if buffers > 16:
            raise CorruptPayload(f"corrupt {what}: tensor '{name}' claims {buffers} buffers")
        sizes, norms = [], []
        for _ in range(buffers):
            count = r.get("Q")
            view = r.take(4 * count)
            sizes.append(count)
            norms.append(_norm(view))
        r.take(8 * r.get("Q"))  # scalars
        records.append(TensorRecord(name, numel, steps, sizes, norms))
    return records


def without_records(data, drop, what="compressor state"):
    """`data` (codec state bytes) with the records whose name satisfies `drop(name)` left out; the same bytes when
    none is (or when `data` is not a C++ codec's state). A damaged state raises CorruptPayload."""
    if not data:
        return data
    r = _Reader(bytes(data), what)
    if r.get("I") != _MAGIC:
        return data
    version = r.get("H")
    if version != _VERSION:
        raise CorruptPayload(f"{what}: version {version}, this reader reads {_VERSION}")
    r.get_string()
    count_at = r.offset
    kept, dropped = [], 0
    for _ in range(r.get("Q")):
        start = r.offset
        name = r.get_string()
        r.get("Q"), r.get("Q")
        buffers = r.get("Q")
        if buffers > 16:
            raise CorruptPayload(f"corrupt {what}: tensor '{name}' claims {buffers} buffers")
        for _ in range(buffers):
            r.take(4 * r.get("Q"))
        r.take(8 * r.get("Q"))
        if drop(name):
            dropped += 1
        else:
            kept.append(bytes(r.data[start:r.offset]))
    if not dropped:
        return data
    head = bytes(r.data[:count_at]) + struct.pack("<Q", len(kept))
    return head + b"".join(kept) + bytes(r.data[r.offset:])
