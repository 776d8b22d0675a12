"""The envelope of every Python-side state file: a compressor's ``state_dict()``, the DDP hook's and
DistributedOptimizer's gradcomp part. It carries what the C++ runtime's state envelope carries
(src/runtime/checkpoint.cc: format version, spec, rank, world size, checksum) plus the kind of owner and its step:

    {"format": "gradcomp.state", "version": 2, "kind": "compressor" | "ddp_hook" | "optimizer", "spec": ...,
     "rank": int | None, "world_size": int | None, "step": int | None, "state": bytes, "checksum": hex}

The checksum is the C++ runtime's (``_gradcomp.state_checksum``: FNV-1a, 64 bit, the library's one hash); it covers
every field and the state bytes, so a flipped or truncated byte anywhere in
them raises gradcomp.CorruptPayload; a state of another kind, codec, rank or world size raises
gradcomp.InvalidArgument. open_state() checks everything before its caller changes anything.
"""
from ._gradcomp import CorruptPayload, InvalidArgument, state_checksum

FORMAT = "gradcomp.state"
VERSION = 2  # 2: the checksum is state_checksum (1: BLAKE2b)
_FIELDS = ("kind", "spec", "rank", "world_size", "step")


def _checksum(fields, state):
    header = repr((FORMAT, VERSION) + tuple(fields[k] for k in _FIELDS)).encode()
    return f"{state_checksum(len(header).to_bytes(8, 'little') + header + state):016x}"


def seal(kind, spec, state, rank=None, world_size=None, step=None):
    """The envelope dict of `state` (bytes: the codec's serialized residuals and counters) saved by an owner of
    `kind` with codec `spec`; rank and world_size where the state is per rank, step where the owner counts steps."""
    envelope = {"format": FORMAT, "version": VERSION, "kind": kind, "spec": spec, "rank": rank,
                "world_size": world_size, "step": step, "state": bytes(state)}
    envelope["checksum"] = _checksum(envelope, envelope["state"])
    return envelope


def open_state(envelope, kind, spec, rank=None, world_size=None, where="load_state_dict"):
    """(state bytes, step) of an envelope made by seal(), after checking it: not an envelope, another format version,
    a checksum mismatch (flipped or truncated bytes, a missing field) -> CorruptPayload; another kind, codec `spec`, or
    (when `rank` is given) another rank or world size -> InvalidArgument. `where` names the caller in messages."""
    if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
        raise CorruptPayload(f"{where}: not a gradcomp state (no '{FORMAT}' envelope; states saved before the "
                             "envelope carry no checksum and cannot be loaded)")
    if envelope.get("version") != VERSION:
        raise CorruptPayload(f"{where}: state format version {envelope.get('version')!r}, this gradcomp reads "
                             f"{VERSION}")
    try:
        fields = {k: envelope[k] for k in _FIELDS}
        state = envelope["state"]
        intact = isinstance(state, (bytes, bytearray)) and envelope["checksum"] == _checksum(fields, bytes(state))
    except (KeyError, TypeError):
        intact = False
    if not intact:
        raise CorruptPayload(f"{where}: corrupt state (checksum mismatch: flipped or truncated bytes, or a missing "
                             "field)")
    if fields["kind"] != kind:
        raise InvalidArgument(f"{where}: this is the state of a {fields['kind']}, not of a {kind}")
    if rank is not None and (fields["rank"], fields["world_size"]) != (rank, world_size):
        raise InvalidArgument(f"{where} on rank {rank} of {world_size}: the state was saved by rank {fields['rank']} "
                              f"of {fields['world_size']} (states are per rank: load each rank's own)")
    if fields["spec"] != spec:
        raise InvalidArgument(f"{where}: state saved by '{fields['spec']}' cannot be loaded into '{spec}'")
    return bytes(state), fields["step"]
