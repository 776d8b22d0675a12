"""The envelope of every Python-side state file (a compressor's ``state_dict()``, the DDP hook's and
DistributedOptimizer's gradcomp part, the elastic commit files): the one C++ state envelope
(include/gradcomp/state_envelope.h), the same bytes ``Runtime.save_state()`` writes, sealed and checked in C++:

    bytes: "GCRS" | version 3 | checksum (state_checksum: FNV-1a 64) | kind, spec, rank, world_size, step, state

A flipped or truncated byte anywhere raises gradcomp.CorruptPayload; a state of another kind, codec, rank or world
size raises gradcomp.InvalidArgument. open_state() checks everything before its caller changes anything. States saved
in the earlier Python-only envelope (a dict of format version 2, with the same checksum) still load.
"""
from . import _gradcomp as _C
from ._gradcomp import CorruptPayload, InvalidArgument, state_checksum

FORMAT = "gradcomp.state"  # the format name of version-2 envelopes (dicts)
VERSION = _C.STATE_ENVELOPE_VERSION
_LEGACY_VERSION = 2
_FIELDS = ("kind", "spec", "rank", "world_size", "step")


def seal(kind, spec, state, rank=None, world_size=None, step=None):
    """The envelope bytes of `state` (bytes: the codec's serialized residuals and counters) saved by an owner of
    `kind` with codec `spec`; rank and world_size where the state is per rank, step where the owner counts steps."""
    return _C.seal_state(kind, spec, bytes(state), rank, world_size, step)


def fields(envelope, where="state"):
    """The checked fields of an envelope (bytes, or a version-2 dict): kind, spec, rank, world_size, step, state.
    Damaged or foreign bytes raise CorruptPayload naming `where`."""
    if isinstance(envelope, (bytes, bytearray, memoryview)):
        return _C.open_state(bytes(envelope), where)
    if isinstance(envelope, dict) and envelope.get("format") == FORMAT:
        return _open_legacy(envelope, where)
    raise CorruptPayload(f"{where}: not a gradcomp state (no envelope; states saved before the envelope carry no "
                         "checksum and cannot be loaded)")


def open_state(envelope, kind, spec, rank=None, world_size=None, where="load_state_dict"):
    """(state bytes, step) of an envelope made by seal() (or a version-2 dict), after checking it: not an envelope,
    another format version, a checksum mismatch (flipped or truncated bytes) -> CorruptPayload; another kind, codec
    `spec`, or (when `rank` is given) another rank or world size -> InvalidArgument. `where` names the caller."""
    f = fields(envelope, where)
    if f["kind"] != kind:
        raise InvalidArgument(f"{where}: this is the state of a {f['kind']}, not of a {kind}")
    if rank is not None and (f["rank"], f["world_size"]) != (rank, world_size):
        raise InvalidArgument(f"{where} on rank {rank} of {world_size}: the state was saved by rank {f['rank']} "
                              f"of {f['world_size']} (states are per rank: load each rank's own)")
    if f["spec"] != spec:
        raise InvalidArgument(f"{where}: state saved by '{f['spec']}' cannot be loaded into '{spec}'")
    return f["state"], f["step"]


def _legacy_checksum(envelope, state):
    header = repr((FORMAT, _LEGACY_VERSION) + tuple(envelope[k] for k in _FIELDS)).encode()
    return f"{state_checksum(len(header).to_bytes(8, 'little') + header + state):016x}"


def _open_legacy(envelope, where):
    """The fields of a version-2 envelope (a dict sealed with the same checksum over its fields and bytes)."""
    if envelope.get("version") != _LEGACY_VERSION:
        raise CorruptPayload(f"{where}: state format version {envelope.get('version')!r}, this gradcomp reads "
                             f"{VERSION} (and {_LEGACY_VERSION})")
    try:
        f = {k: envelope[k] for k in _FIELDS}
        state = envelope["state"]
        intact = isinstance(state, (bytes, bytearray)) and envelope["checksum"] == _legacy_checksum(f, bytes(state))
    except (KeyError, TypeError):
        intact = False
    if not intact:
        raise CorruptPayload(f"{where}: corrupt state (checksum mismatch: flipped or truncated bytes, or a missing "
                             "field)")
    f["state"] = bytes(state)
    return f
