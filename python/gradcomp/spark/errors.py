"""RankFailed: one rank's exception inside a Spark task, carried to the driver as text.

A task's exception reaches the driver only as the text of Spark's failure message (a Java exception wrapping the
Python one). The task side writes the rank and its traceback between markers (rank_failure_message); the driver finds
them again (find_rank_failure) and raises RankFailed, so the caller sees which rank failed and where, not a JVM stack.
"""
import re

_BEGIN = "gradcomp.spark: rank {rank} of {size} failed; its traceback follows"
_END = "gradcomp.spark: end of rank {rank}'s traceback"
_PATTERN = re.compile(r"gradcomp\.spark: rank (\d+) of (\d+) failed; its traceback follows\n(.*?)\n"
                      r"gradcomp\.spark: end of rank \1's traceback", re.DOTALL)


class RankFailed(RuntimeError):
    """A rank's `fn` raised inside its Spark task. rank: the failed rank; size: the number of ranks; remote_traceback:
    the traceback as formatted in the task (its last line names the exception type and message)."""

    def __init__(self, rank, size, remote_traceback):
        self.rank = rank
        self.size = size
        self.remote_traceback = remote_traceback
        super().__init__(f"gradcomp.spark.run: rank {rank} of {size} failed:\n{remote_traceback}")


def rank_failure_message(rank, size, formatted_traceback):
    """The text a failing task raises with: rank, size and traceback between the markers find_rank_failure reads."""
    return (_BEGIN.format(rank=rank, size=size) + "\n" + formatted_traceback.rstrip("\n") + "\n" +
            _END.format(rank=rank))


def find_rank_failure(text):
    """The RankFailed described in `text` (a Spark failure message), or None when it holds no rank's failure (the
    stage failed outside `fn`: a lost executor, a killed job, an error in gradcomp.spark's own task code)."""
    m = _PATTERN.search(text)
    if m is None:
        return None
    return RankFailed(int(m.group(1)), int(m.group(2)), m.group(3))


# Signs of an exception caused by a peer's failure (its sockets closed, or it stopped answering): gradcomp's
# communication errors and torch.distributed's, by type name or gloo/NCCL message, anywhere in the exception's chain.
_PEER_ERROR_TYPES = ("CommError", "Timeout", "HorovodInternalError", "DistError", "DistBackendError",
                     "DistNetworkError", "DistStoreError")
_PEER_ERROR_TEXT = ("connection closed by peer", "connection reset by peer", "broken pipe", "gloo", "nccl")


def is_peer_failure(exc):
    """Whether `exc` is (or was caused by) a communication failure: what the surviving ranks raise when another rank
    failed first. Such a rank reports after a grace period (task.py), so the driver sees the first rank's own
    exception instead of the consequence in its peers."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(t.__name__ in _PEER_ERROR_TYPES for t in type(exc).__mro__):
            return True
        text = str(exc).lower()
        if any(s in text for s in _PEER_ERROR_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
