"""How hvd.join() learns what to take part in without costing a step anything while no rank is joined: notes, sent
point to point outside every collective, instead of a control round before each operation.

Every rank counts the global-set operations join() serves (an allreduce, a compressed allreduce, one gradient's
exchange of a DistributedOptimizer step) in the order it begins them: the same count on every rank, since every rank
runs the same collectives in the same order. An operation begins with begin() (a lock and a dict entry; nothing is
sent while no rank is joined) and ends with end().

A rank that joins sends a JOIN note (its generation and its count) to every other rank. Each rank's listener thread
records it and answers with an OP note for every operation it has begun and not ended; from then on begin() sends
the OP note of each new operation to the joined ranks too. An operation the others began before the JOIN note came
cannot have finished (it needs the joined rank), so the joined rank learns every operation it must serve: it replays
them in count order with zeros, skips the copies other ranks sent of the same one, and ends when every rank's JOIN
note of this generation is in. While some rank is joined, each rank that is not sends it an ALIVE note every
beat (a tenth of the timeout, at most 2 s), so a joined rank waits as long as the others live, however long they run
no served operation (an evaluation, the runtime backend's own steps), and names the rank that falls silent for the
timeout (dead, or its listener failed). Then every rank knows every rank's counts at its join (served operations,
and the tensors the runtime backend's fusion runtime negotiated: tally()), so all agree, without a round, on which
rank joined last (the highest counts; of equal counts the highest rank).

Transports: the MPI backends send notes through a C++ Mailbox over a duplicate of MPI_COMM_WORLD (the listener polls
it with naps of up to 100 ms, so idle it costs no traffic and about ten probes a second, and a JOIN note waits at most
that long, once per join; the joined rank polls it itself with short naps while it serves); the torch backend through
point-to-point messages of a gloo group of its own (the listener waits in a receive from any rank; it ends once every
other rank has sent it a CLOSE note)."""
import contextlib
import datetime
import json
import queue
import threading
import time

import torch
import torch.distributed as dist

from .._compressors import InvalidArgument
from .._gradcomp import CommError, Timeout

_NOTE_BYTES = 4096
_LISTEN_S = 5.0  # how often the MPI listener looks at its stop flag (close() wakes it sooner)
_IDLE_NAP_S = 0.1  # the MPI listener's longest nap between polls: a JOIN note waits at most this once per join
_BUSY_NAP_S = 0.0005  # the joined rank's, while it expects OP notes
notes_sent = 0  # JOIN and OP notes this process has sent (tests: none while no rank is joined)
beats_sent = 0  # ALIVE notes this process has sent (only while some rank is joined)


class Notes:
    """The notes of one world: this rank's count of served operations, the open ones, who has joined."""

    def __init__(self, transport, rank, size, timeout_s):
        self._transport, self.rank, self.size, self.timeout_s = transport, rank, size, timeout_s
        self._lock = threading.Lock()  # the state below; never held while sending
        self._send_lock = threading.Lock()  # one note at a time through the transport
        self.count = 0  # served operations begun (or replayed) so far
        self.negotiated = 0  # tensors handed to the runtime backend's fusion runtime (its join serves them)
        self.generation = 0  # joins completed so far (the same on every rank)
        self._open = {}  # count -> the operation's descriptor (a dict), begun and not ended
        self._joined = {}  # generation -> {rank: its count when it joined}
        self._ops = queue.Queue()  # OP notes received (read by join())
        self._closed = False
        self._closed_peers = 0  # CLOSE notes received (gloo)
        self._heard = {}  # rank -> time.monotonic() of its last note
        self._error = None  # a background thread's failed note: begin() and join() raise it
        self._beats = None  # the thread sending ALIVE notes while some rank is joined and this one is not
        self._beat_due = threading.Condition(self._lock)  # wakes the beats: a new JOIN note, or close()
        self._local = threading.local()  # depth: served operations this thread is inside
        self._listener = threading.Thread(target=self._listen, name="gradcomp-join-notes", daemon=True)
        self._listener.start()

    # -- an active rank ---------------------------------------------------------------------------------------------
    def begin(self, descriptor):
        """Counts an operation this rank is about to run (`descriptor`: a dict that tells a joined rank how to replay
        it, with "k" its kind); returns its number, for end(). Nothing is counted when it raises."""
        if self._error is not None:
            raise self._error
        with self._lock:
            n = self.count + 1
            peers = list(self._joined.get(self.generation, ()))
            note = self._op_note(n, descriptor) if peers else None
            if note is not None:
                self._check_size(note, descriptor)
            self.count = n
            self._open[n] = descriptor
            self._count_sent(len(peers))
        for peer in peers:  # outside the lock: a gloo send waits for the peer's listener
            self._send(peer, note)
        return n

    def tally(self):
        """Counts a tensor the fusion runtime negotiates (sent nowhere: it only orders the joins, as begin() does)."""
        self.negotiated += 1

    def end(self, n):
        with self._lock:
            self._open.pop(n, None)

    def joined_ranks(self):
        """The ranks known to be in join() now (this generation)."""
        with self._lock:
            return sorted(self._joined.get(self.generation, ()))

    @contextlib.contextmanager
    def serving(self):
        """Marks this thread as inside an operation join() serves (check_served() passes there)."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def check_served(self, members=None):
        """Before a collective of the global set (members None) or of a process set (its ranks): InvalidArgument when
        a member is in join() and this rank is not, outside an operation join() serves (the joined rank would never
        take part). A rank that joins after this check is seen by the collective's timeout instead."""
        if getattr(self._local, "depth", 0) > 0:
            return
        joined = [r for r in self.joined_ranks() if members is None or r in members]
        if joined and self.rank not in joined:
            raise InvalidArgument(f"gradcomp.torch on rank {self.rank} of {self.size}: rank(s) {joined} are in join(), "
                                  "which serves the global set's allreduces and DistributedOptimizer steps only; "
                                  "this collective (allgather, broadcast, alltoall, reducescatter, an object "
                                  "collective, barrier, Adasum, a process set's) would wait for them: run it before "
                                  "join() on every rank")

    # -- the joined rank --------------------------------------------------------------------------------------------
    def join(self, replay, idle_check=None):
        """This rank has joined: serves, through replay(descriptor), every operation the others run, in count order,
        until every rank has joined; returns the rank that joined last. idle_check() runs while no note comes (it may
        raise)."""
        with self._lock:
            generation = self.generation
            at = [self.count, self.negotiated]
            self._joined.setdefault(generation, {})[self.rank] = at
            note = json.dumps({"t": "join", "g": generation, "at": at}).encode()
            self._count_sent(self.size - 1)
        for peer in range(self.size):
            if peer != self.rank:
                self._send(peer, note)
        waiting = {}  # count -> OP note that came before its turn
        start = time.monotonic()
        while True:
            with self._lock:
                everyone = dict(self._joined.get(generation, {}))
            if len(everyone) == self.size:
                break
            note = self._next_op(0.05)
            if note is None:
                if idle_check is not None:
                    idle_check()
                if self._error is not None:
                    raise self._error
                self._check_alive(everyone, start)
                continue
            if note["n"] > self.count:  # an earlier count is a copy another rank sent, or an earlier join's
                waiting[note["n"]] = note
            while self.count + 1 in waiting:
                replay(waiting.pop(self.count + 1))
                self.count += 1
        with self._lock:
            self.generation += 1
            self._joined.pop(generation, None)
            # Every rank now stands where the last one joined (it served the rest): the counts agree again.
            self.negotiated = max(at[1] for at in everyone.values())
            if self._joined.get(self.generation):  # a rank already joined again (its JOIN note came early)
                self._start_beats()
        return max(everyone, key=lambda r: (*everyone[r], r))

    def _check_alive(self, everyone, start):
        """Timeout naming the ranks not yet joined from which no note (ALIVE, OP or JOIN) came for the timeout."""
        now = time.monotonic()
        silent = [r for r in range(self.size) if r not in everyone and now - max(self._heard.get(r, start), start)
                  > self.timeout_s]
        if silent:
            raise Timeout(f"gradcomp.torch join() on rank {self.rank} of {self.size}: no note from rank(s) {silent} "
                          f"for {self.timeout_s:g} s (ranks joined so far: {sorted(everyone)}): they are dead, or "
                          "their join notes failed")

    # -- a rank that is not joined, while another is -----------------------------------------------------------------
    def beat_s(self):
        """How often a rank that is not joined tells the joined ones that it lives."""
        return max(0.02, min(2.0, self.timeout_s / 10))

    def _start_beats(self):
        """Under self._lock: the ALIVE notes' thread, or a beat now from the one that runs."""
        if self._closed:
            return
        if self._beats is None:
            self._beats = threading.Thread(target=self._beat, name="gradcomp-join-beats", daemon=True)
            self._beats.start()
        else:
            self._beat_due.notify()

    def _beat(self):
        """An ALIVE note to each joined rank now and every beat_s(), until no rank is joined or this one joins."""
        global beats_sent
        note = json.dumps({"t": "alive"}).encode()
        while True:
            with self._lock:
                joined = self._joined.get(self.generation, {})
                if self._closed or not joined or self.rank in joined:
                    self._beats = None  # this generation's join ended here, or this rank joined too
                    return
                peers = sorted(joined)
                beats_sent += len(peers)
            try:
                for peer in peers:
                    self._send(peer, note)
            except Exception as e:  # noqa: BLE001 (kept: the next begin() raises it)
                self._fail(e)
                with self._lock:
                    self._beats = None
                return
            with self._lock:
                self._beat_due.wait(self.beat_s())

    def _fail(self, error):
        """Keeps the first failure of a background thread's note, for the training thread to raise."""
        with self._lock:
            if self._error is None:
                self._error = CommError(f"gradcomp.torch on rank {self.rank} of {self.size}: join's notes failed: "
                                        f"{error}")

    # -- both -------------------------------------------------------------------------------------------------------
    def close(self):
        """Ends the listener (on gloo once every other rank has closed too: each sends every other one a CLOSE note);
        False when it did not end within 5 s."""
        with self._lock:
            self._closed = True
            self._beat_due.notify_all()
        self._transport.close(self._send_lock)
        self._listener.join(timeout=5.0)
        return not self._listener.is_alive()

    def _op_note(self, n, descriptor):
        return json.dumps({"t": "op", "n": n, **descriptor}).encode()

    def _check_size(self, note, descriptor):
        if len(note) > _NOTE_BYTES - 4:
            what = f"'{descriptor['name']}'" if "name" in descriptor else f"a {descriptor.get('k')} operation"
            raise InvalidArgument(f"gradcomp.torch on rank {self.rank} of {self.size}: join() cannot serve {what}: "
                                  f"its note takes {len(note)} bytes (at most {_NOTE_BYTES - 4}); shorten the name")

    def _send(self, peer, note):
        """One note (never under self._lock: on gloo a send completes when the peer's listener takes it, and that
        listener may be waiting for its own lock). Notes from two threads may overtake each other: join() orders
        OP notes by their count."""
        with self._send_lock:
            self._transport.send(peer, note)

    @staticmethod
    def _count_sent(notes):
        """Under self._lock, where the notes are decided: before the operation they answer can end."""
        global notes_sent
        notes_sent += notes

    def _listen(self):
        while True:
            try:
                got = self._transport.receive(_LISTEN_S, _IDLE_NAP_S)
            except Exception:  # the transport is gone (shutdown, a dead peer): join() reports its own timeout
                return
            if got is None:
                if self._closed:
                    return
                continue
            try:
                if not self._dispatch(*got):
                    return
            except Exception as e:  # noqa: BLE001 (an answer it could not send: kept, and it listens on)
                self._fail(e)

    def _dispatch(self, sender, data):
        """Handles a received note (on the listener, or on the joined rank's own thread); False once every other rank
        has closed."""
        note = json.loads(bytes(data).decode())
        self._heard[sender] = time.monotonic()
        if note["t"] == "alive":
            return True
        if note["t"] == "close":
            with self._lock:
                self._closed_peers += 1
                return self._closed_peers < self.size - 1  # then no rank will send another note
        if note["t"] == "op":
            self._ops.put(note)
            return True
        with self._lock:  # "join"
            self._joined.setdefault(note["g"], {})[sender] = note["at"]
            # Operations up to its count the joiner took part in (they may not have ended here yet).
            still_open = sorted((n, d) for n, d in self._open.items() if n > note["at"][0]) \
                if note["g"] == self.generation else []
            self._count_sent(len(still_open))
            if note["g"] == self.generation and self.rank not in self._joined[note["g"]]:
                self._start_beats()
        for n, descriptor in still_open:
            self._send(sender, self._op_note(n, descriptor))
        return True

    def _next_op(self, wait):
        """The next OP note received, waiting at most `wait` s; None if none. Where the transport polls (MPI), the
        joined rank receives here with short naps instead of waiting for the listener's idle ones."""
        try:
            return self._ops.get_nowait()
        except queue.Empty:
            pass
        if self._transport.polls:
            got = self._transport.receive(wait, _BUSY_NAP_S)
            if got is not None:
                self._dispatch(*got)
            try:
                return self._ops.get_nowait()
            except queue.Empty:
                return None
        try:
            return self._ops.get(timeout=wait)
        except queue.Empty:
            return None


class MpiTransport:
    """Notes through the C++ Mailbox (a duplicate of MPI_COMM_WORLD); receiving polls, from any thread."""

    polls = True

    def __init__(self, mailbox):
        self._box = mailbox

    def send(self, peer, note):
        self._box.send(peer, note)

    def receive(self, wait_s, max_nap_s):
        return self._box.receive(wait_s, max_nap_s)

    def close(self, lock):
        self._box.close()  # the listener's receive returns within one nap


class GlooTransport:
    """Notes as point-to-point messages of a gloo group of their own over the whole world (fixed 4 KiB: a 4-byte
    length, then the note)."""

    _TAG = 0x6a6e
    polls = False  # one receive at a time, the listener's: the joined rank reads what it queues

    def __init__(self, group, rank, size):
        self._group, self._rank, self._size = group, rank, size

    @staticmethod
    def _frame(note):
        buf = torch.zeros(_NOTE_BYTES, dtype=torch.uint8)
        buf[:4] = torch.tensor(list(len(note).to_bytes(4, "little")), dtype=torch.uint8)
        buf[4:4 + len(note)] = torch.frombuffer(bytearray(note), dtype=torch.uint8)
        return buf

    def send(self, peer, note):
        dist.send(self._frame(note), dst=peer, group=self._group, tag=self._TAG)

    def receive(self, wait_s=None, max_nap_s=None):
        buf = torch.empty(_NOTE_BYTES, dtype=torch.uint8)
        work = dist.irecv(buf, src=None, group=self._group, tag=self._TAG)
        work.wait(datetime.timedelta(days=365))  # gloo has no probe: the other ranks' CLOSE notes end the listener
        sender = work._source_rank()  # the group spans the world in rank order: a group rank is a global one
        length = int.from_bytes(buf[:4].numpy().tobytes(), "little")
        return sender, buf[4:4 + length].numpy().tobytes()

    def close(self, lock):
        """A CLOSE note to every other rank at once, each given 5 s (a dead or late peer costs its own 5 s at most,
        and stops no other peer's note)."""
        frame = self._frame(json.dumps({"t": "close"}).encode())
        with lock:
            sends = []
            for peer in range(self._size):
                if peer != self._rank:
                    try:
                        sends.append(dist.isend(frame, dst=peer, group=self._group, tag=self._TAG))
                    except Exception:  # noqa: BLE001 (a peer already gone: its listener ends with it)
                        pass
            for work in sends:
                try:
                    work.wait(datetime.timedelta(seconds=5))
                except Exception:  # noqa: BLE001
                    pass
