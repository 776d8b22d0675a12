"""How long Python holds the tensors it hands to torch.distributed.

A gloo (or NCCL watchdog) thread keeps its own reference to a collective's tensors and drops it a moment after the
collective completes. If Python's reference went first, torch has turned the tensor's Python object over to C++, and
the thread's drop must take the GIL to free it; when that happens while the interpreter is exiting, the thread is
killed inside a noexcept frame and the process aborts ("terminate called without an active exception") after the
script itself succeeded. So every tensor handed to a collective stays referenced here until many later collectives
have run, and the last ones until interpreter exit: torch's own threads then never free a Python object."""
import collections
import threading

# Collectives a tensor outlives before Python lets it go: gloo drops its reference microseconds after completion;
# this many later collectives on the same thread of the program make a late drop practically impossible.
KEEP_CALLS = 16

_recent = collections.deque(maxlen=KEEP_CALLS)
_lock = threading.Lock()


def keep_for_torch(*objects):
    """References `objects` (tensors, lists of tensors, torch Work objects) handed to a torch.distributed collective
    until KEEP_CALLS later calls of this function, and the last KEEP_CALLS until the interpreter exits. Cheap: views of
    persistent buffers cost nothing; a temporary copy costs its memory for that long."""
    with _lock:
        _recent.append(objects)
