"""join_notes.Notes in one process: ranks joined by in-memory queues instead of MPI or gloo, so that a rank can be
made to die (its notes dropped) or its link to fail. A joined rank waits out a live rank's long quiet (ALIVE notes),
names a dead rank in its Timeout, an answer that cannot be sent is raised by the next begin() of that rank, and an
operation whose note is too long is refused without being counted."""
import queue
import threading
import time

import pytest

from gradcomp import CommError, InvalidArgument, Timeout
from gradcomp.torch import join_notes


class _Wire:
    """One queue per rank; a rank's transport puts (sender, bytes) into the peer's queue."""

    def __init__(self, size):
        self.boxes = [queue.Queue() for _ in range(size)]


class _Transport:
    polls = False

    def __init__(self, wire, rank, dead=False, broken=False):
        self._wire, self._rank, self.dead, self.broken = wire, rank, dead, broken

    def send(self, peer, note):
        if self.broken:
            raise CommError(f"test link from rank {self._rank} is down")
        if not self.dead:
            self._wire.boxes[peer].put((self._rank, bytes(note)))

    def receive(self, wait_s, max_nap_s=None):
        try:  # None: a closed box's wake-up
            return self._wire.boxes[self._rank].get(timeout=wait_s)
        except queue.Empty:
            return None

    def close(self, lock):
        self._wire.boxes[self._rank].put(None)  # wakes the listener, which then sees it is closed


def _world(size, timeout_s, flags_of=None):
    """Notes for ranks 0..size-1; flags_of: rank -> _Transport flags (e.g. {2: {"dead": True}})."""
    wire = _Wire(size)
    transports = [_Transport(wire, r, **(flags_of or {}).get(r, {})) for r in range(size)]
    return [join_notes.Notes(t, r, size, timeout_s) for r, t in enumerate(transports)], transports


def _join_in_thread(notes, replayed):
    result = {}

    def run():
        try:
            result["last"] = notes.join(replayed.append)
        except BaseException as e:  # noqa: BLE001 (the test reads it)
            result["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _close_all(notes):
    for n in notes:
        n.close()


def test_alive_notes_keep_a_joined_rank_waiting_past_the_timeout():
    notes, _ = _world(2, timeout_s=0.3)
    replayed = []
    thread, result = _join_in_thread(notes[0], replayed)
    time.sleep(1.2)  # four timeouts without a served operation on rank 1
    assert thread.is_alive(), f"rank 0's join() ended while rank 1 lived: {result}"
    n = notes[1].begin({"k": "allreduce", "name": "late"})
    notes[1].end(n)  # (a real operation ends after the joined rank took part; the note went out at begin())
    assert notes[1].join(lambda d: None) == 1
    thread.join(5)
    assert result.get("last") == 1, result
    assert [d["name"] for d in replayed] == ["late"]
    _close_all(notes)


def test_a_dead_rank_is_named_in_the_timeout():
    notes, _ = _world(3, 0.3, {2: {"dead": True}})
    thread, result = _join_in_thread(notes[0], [])
    thread.join(10)
    error = result.get("error")
    assert isinstance(error, Timeout), result
    assert "rank(s) [2]" in str(error) and "rank 0 of 3" in str(error), str(error)
    _close_all(notes)


def test_an_answer_that_cannot_be_sent_is_raised_by_the_next_begin():
    notes, transports = _world(2, timeout_s=5.0)
    n = notes[1].begin({"k": "allreduce", "name": "open"})  # open when rank 0 joins: rank 1 must answer with it
    transports[1].broken = True
    thread, result = _join_in_thread(notes[0], [])
    deadline = time.monotonic() + 5
    while notes[1]._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    notes[1].end(n)
    with pytest.raises(CommError, match="rank 1 of 2: join's notes failed: test link from rank 1 is down"):
        notes[1].begin({"k": "allreduce", "name": "next"})
    assert notes[1].count == 1, "the refused operation was counted"
    notes[0].close()
    notes[1].close()


def test_an_operation_whose_note_is_too_long_is_refused_uncounted():
    notes, _ = _world(2, timeout_s=5.0)
    replayed = []
    thread, result = _join_in_thread(notes[0], replayed)
    deadline = time.monotonic() + 5
    while not notes[1].joined_ranks() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(InvalidArgument, match="rank 1 of 2: join\\(\\) cannot serve 'xxxx"):
        notes[1].begin({"k": "compressed", "name": "x" * 5000})
    assert notes[1].count == 0
    notes[1].join(lambda d: None)
    thread.join(5)
    assert result.get("last") == 1 and replayed == [], result
    _close_all(notes)
