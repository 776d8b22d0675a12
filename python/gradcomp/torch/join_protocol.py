"""The control round behind hvd.join(): before each global-set allreduce of gradcomp.torch's functions and before
each DistributedOptimizer step's gradient exchange, every rank says in one 40-byte allgather what it is about to do,
so that ranks that have joined (no more data) can take part with zeros until every rank has joined.

A row is int64[5]: (kind, a, b, c, d)
    JOINED     (0, 0, 0, 0, 0)                               this rank is in join()
    ALLREDUCE  (1, dtype index, numel, op index, 0)          an allreduce of gradcomp.torch's functions
    STEP       (2, optimizer key, parameter count, 0, step)  a DistributedOptimizer's step; the key is a CRC-32 of
                                                             its parameter names in order (the same on every rank)
    COMPRESSED (3, dtype index, numel, op index, 0)          allreduce(compression=...) where no runtime negotiates
                                                             it; while some rank is joined, the codec spec, name and
                                                             shape follow in one allgatherv (share())
Ranks that are not joined must agree on (kind, a, b, c) (InvalidArgument on every rank otherwise, naming the tensor
and the ranks of both sides); d is the step counter, which a joined rank takes over.

On the runtime backend a DistributedOptimizer's step (global set, C++ codec) has no control round: its gradients go
through the fusion runtime, whose negotiation carries the joined flag (Runtime::join, docs/runtime.md), so join()
runs the runtime's join beside this protocol's rounds. So do the global set's float32 Average and Sum allreduces
(collectives._runtime_takes); the rounds then serve the other allreduces alone."""
import threading
import weakref
import zlib

import torch

from .._compressors import InvalidArgument
from .context import _ctx
from .errors import _internal_errors
from . import comm_ops as _ops

JOINED, ALLREDUCE, STEP, COMPRESSED = 0, 1, 2, 3
_KINDS = {JOINED: "join()", ALLREDUCE: "an allreduce", STEP: "a DistributedOptimizer step",
          COMPRESSED: "a compressed allreduce"}

_participants = []  # weak references to the global-set DistributedOptimizers, in creation order
rounds = 0  # control rounds this process has run (the cost of join support; tests count it per step)


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


def announce_compressed(row, description, replay):
    """Before a global-set allreduce(compression=...) that no runtime negotiates: the control round of `row`
    (COMPRESSED), checked as check_agreement does; when some rank is joined, `replay` (what a joined rank needs to
    take part: JSON of the codec spec, the name and the shape) follows in one allgatherv, only then."""
    rows = control(row)
    check_agreement(rows, description)
    if bool((rows[:, 0] == JOINED).any()):
        share(replay)


def share(text):
    """Every rank's `text`, in rank order (one allgatherv on the control round's channel; every rank calls it)."""
    return _descriptions(text)


def _descriptions(mine):
    """Every rank's description, on the control round's channel (only after a mismatch, which every rank sees)."""
    gathered, sizes = _ops.allgatherv(torch.tensor(list(mine.encode()), dtype=torch.uint8),
                                      _ctx.control_comm, "join protocol")
    ends = torch.tensor(sizes).cumsum(0).tolist()
    return [gathered[end - size:end].numpy().tobytes().decode() for end, size in zip(ends, sizes)]


def optimizer_key(names):
    """The STEP rows' name of an optimizer: CRC-32 of its parameter names, in order."""
    return zlib.crc32("\n".join(names).encode())


def register(optimizer):
    """Makes a global-set DistributedOptimizer (with `_join_key` = (optimizer_key, parameter count) and
    `_join_replay(step)`) replayable by join()."""
    _participants[:] = [ref for ref in _participants if ref() is not None]
    _participants.append(weakref.ref(optimizer))


def announce_step(key, count, step):
    """Before the exchange of step `step` of the optimizer `key` with `count` parameters: True when some rank is
    joined (the step's exchange must then take the order a joined rank can replay: every parameter, in order)."""
    rows = control([STEP, key, count, 0, step])
    check_agreement(rows, f"a DistributedOptimizer step ({count} parameters, parameter-name key {key})")
    return bool((rows[:, 0] == JOINED).any())


def negotiated(compressor):
    """True when a global-set DistributedOptimizer with `compressor` needs no STEP rounds: the runtime backend's fusion
    runtime negotiates its tensors, and a joined rank serves them from Runtime.join()."""
    return _ctx.runtime is not None  # every codec, Python ones too, runs inside the runtime there


class RuntimeJoin:
    """Runtime.join() of the runtime backend on a thread of its own (it blocks until every rank joined, with the GIL
    released), beside join()'s control rounds; a no-op on the other backends."""

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

    def wait(self):
        if self._thread is None:
            return
        with _internal_errors():
            self._thread.join()
            if self._error is not None:
                raise self._error


def replay_step(row):
    """On a joined rank: take part in the step of `row` with zero gradients (the newest live optimizer of that
    key replays it)."""
    key, step = int(row[1]), int(row[4])
    for ref in reversed(_participants):
        optimizer = ref()
        if optimizer is not None and optimizer._join_key is not None and optimizer._join_key[0] == key:
            optimizer._join_replay(step)
            return
    raise InvalidArgument(f"join(): the other ranks step a DistributedOptimizer (parameter-name key {key}) that this "
                          "rank does not have: create the same optimizers, with the same named parameters, on every "
                          "rank")
