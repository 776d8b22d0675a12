"""hvd.join()'s protocol: which operations a joined rank serves, and how (join_notes.py says how it learns of them).

A joined rank serves, with zeros, the global-set operations the others run: an allreduce of gradcomp.torch's
functions, allreduce(compression=...) where no runtime negotiates it, and each gradient's exchange of a
DistributedOptimizer step (the runtime backend's fusion runtime negotiates its steps and float32 Average/Sum
allreduces itself, and Runtime.join() serves them: RuntimeJoin, beside the notes). Each is begun with served(), whose
descriptor tells a joined rank how to replay it; nothing is sent while no rank is joined.

The plain and compressed allreduces also check, in one 40-byte control round, that the ranks agree on what they
reduce (check_agreement: InvalidArgument naming the tensor and both ranks otherwise); a joined rank takes part in it
with a JOINED row. A row is int64[5]: (kind, dtype index, numel, op index, 0), kind JOINED 0, ALLREDUCE 1,
COMPRESSED 3. Ranks that are not joined must agree on the first four."""
import contextlib
import threading
import weakref
import zlib

import torch

from .._compressors import InvalidArgument
from .context import _ctx
from .errors import _internal_errors
from . import comm_ops as _ops

JOINED, ALLREDUCE, COMPRESSED = 0, 1, 3
_KINDS = {JOINED: "join()", ALLREDUCE: "an allreduce", COMPRESSED: "a compressed allreduce"}

_participants = []  # weak references to the global-set DistributedOptimizers, in creation order
rounds = 0  # control rounds this process has run (tests count them per step: none)


@contextlib.contextmanager
def served(descriptor):
    """Runs the body as one operation join() serves (join_notes.Notes.begin: `descriptor` tells a joined rank how to
    replay it); a no-op on one rank."""
    notes = _ctx.notes
    if notes is None:
        yield
        return
    n = notes.begin(descriptor)
    try:
        with notes.serving():
            yield
    finally:
        notes.end(n)


def begin(descriptor):
    """served() for an operation that ends later (end(n) when its handle is waited for); 0 on one rank."""
    return _ctx.notes.begin(descriptor) if _ctx.notes is not None else 0


def end(n):
    if _ctx.notes is not None and n:
        _ctx.notes.end(n)


def control(row):
    """One control round of the global set: every rank's row, (size, 5) int64 in rank order. On the torch backend it
    runs on a gloo group of its own (init(): _ctx.control_comm), never between the exchange worker's collectives on
    the default group."""
    global rounds
    rounds += 1
    return _ops.allgather_fixed(torch.tensor(row, dtype=torch.int64), _ctx.control_comm)


def check_agreement(rows, description):
    """The rows of the ranks that are not joined must be equal; returns those rows. Otherwise every rank (each sees
    the same rows) exchanges its `description` (what it is about to do, naming the tensor) and raises InvalidArgument
    naming both sides and their ranks, as gradcomp::check_agreement does."""
    _check_rows(rows)
    active = [r for r in range(len(rows)) if int(rows[r, 0]) != JOINED]
    other = next((r for r in active if not bool((rows[r, :4] == rows[active[0], :4]).all())), None)
    if other is None:
        return rows[rows[:, 0] != JOINED]
    said = _descriptions(description)
    raise InvalidArgument(f"gradcomp.torch: ranks disagree on the next global-set collective (seen on rank "
                          f"{_ctx.rank} of {_ctx.size}): rank {active[0]} has {said[active[0]]}, but rank {other} has "
                          f"{said[other]}")


def _check_rows(rows):
    """A row of an unknown kind means some rank's round was not a control round: while a rank was joined, the others
    ran a collective join() does not serve, whose bytes landed here. InvalidArgument saying so, not an IndexError."""
    bad = next((r for r in range(len(rows)) if int(rows[r, 0]) not in _KINDS), None)
    if bad is not None:
        raise InvalidArgument(f"gradcomp.torch join(): rank {bad}'s control row {rows[bad].tolist()} is not one join() "
                              f"sends (seen on rank {_ctx.rank} of {_ctx.size}): while a rank is joined the others ran "
                              "a collective join() does not serve (CompressedAdam, allgather, broadcast, alltoall, a "
                              "process set's collectives, Adasum, the DDP hook)")


def _descriptions(mine):
    """Every rank's description, on the control round's channel (only after a mismatch, which every rank sees)."""
    gathered, sizes = _ops.allgatherv(torch.tensor(list(mine.encode()), dtype=torch.uint8),
                                      _ctx.control_comm, "join protocol")
    ends = torch.tensor(sizes).cumsum(0).tolist()
    return [gathered[end - size:end].numpy().tobytes().decode() for end, size in zip(ends, sizes)]


def optimizer_key(names):
    """The name of an optimizer in its OP notes: CRC-32 of its parameter names, in order."""
    return zlib.crc32("\n".join(names).encode())


def register(optimizer):
    """Makes a global-set DistributedOptimizer (with `_join_key` = (optimizer_key, parameter count) and
    `_join_replay(step)`) replayable by join()."""
    _participants[:] = [ref for ref in _participants if ref() is not None]
    _participants.append(weakref.ref(optimizer))


def negotiated(compressor):
    """True when a global-set DistributedOptimizer with `compressor` needs no notes: the runtime backend's fusion
    runtime negotiates its tensors, and a joined rank serves them from Runtime.join()."""
    return _ctx.runtime is not None  # every codec, Python ones too, runs inside the runtime there


class RuntimeJoin:
    """Runtime.join() of the runtime backend on a thread of its own (it blocks until every rank joined, with the GIL
    released), beside join()'s notes; a no-op on the other backends."""

    def __init__(self):
        self._error = None
        self._thread = None
        if _ctx.runtime is not None:
            self._thread = threading.Thread(target=self._run, name="gradcomp-join", daemon=True)
            self._thread.start()

    def _run(self):
        try:
            _ctx.runtime.join()
        except BaseException as e:  # reported by wait(), on the caller's thread
            self._error = e

    def check(self):
        """Raises the runtime join's error, if it failed already (while join() waits for notes)."""
        if self._error is not None:
            self.wait()

    def wait(self):
        if self._thread is None:
            return
        with _internal_errors():
            self._thread.join()
            if self._error is not None:
                raise self._error


def replay_step(note):
    """On a joined rank: take part in one gradient's exchange of the others' DistributedOptimizer step (an OP note
    of kind "grad" or "sparse") with zeros; the newest live optimizer of that key replays it."""
    key = int(note["key"])
    for ref in reversed(_participants):
        optimizer = ref()
        if optimizer is not None and optimizer._join_key is not None and optimizer._join_key[0] == key:
            optimizer._join_replay(note)
            return
    raise InvalidArgument(f"join() on rank {_ctx.rank} of {_ctx.size}: the other ranks step a DistributedOptimizer "
                          f"(key {key}: the CRC-32 of its parameter names) that this rank does not have: create the "
                          "same optimizers, with the same named parameters, on every rank")
