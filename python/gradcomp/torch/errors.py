"""Horovod's error classes, mapped onto gradcomp's: a collective of gradcomp.torch that fails in communication raises
HorovodInternalError, a subclass of gradcomp.CommError (a timeout: also a gradcomp.Timeout), so both Horovod's
``except hvd.HorovodInternalError`` and gradcomp's ``except gradcomp.CommError`` catch it."""
import contextlib

import torch.distributed

from .._gradcomp import CommError, Timeout


class HorovodInternalError(CommError):
    """A collective failed (a peer died, the communicator broke, a deadline passed): as horovod.common.exceptions."""


class HorovodInternalTimeout(HorovodInternalError, Timeout):
    """A collective did not complete within the communicator's timeout."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's signal that the host set changed: raised on every rank by State.commit() /
    check_host_updates() after State.on_hosts_updated(); elastic.run then resets without restoring the state."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


# torch >= 2.1 raises these for communication failures; torch 1.13 a RuntimeError naming the transport.
_DIST_ERRORS = tuple(getattr(torch.distributed, n) for n in ("DistBackendError", "DistNetworkError")
                     if hasattr(torch.distributed, n))
_TRANSPORT_MARKERS = ("gloo/transport", "Connection reset by peer", "Connection closed by peer", "NCCL error")


def _is_comm_failure(e):
    """True for torch.distributed's errors of a failed peer or link (not for a misuse such as a wrong shape)."""
    if _DIST_ERRORS and isinstance(e, _DIST_ERRORS):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _TRANSPORT_MARKERS)


@contextlib.contextmanager
def _internal_errors():
    """Re-raises gradcomp's CommError / Timeout and torch.distributed's communication failures (a peer died, a link
    broke) as HorovodInternalError, keeping the original as __cause__."""
    try:
        yield
    except HorovodInternalError:
        raise
    except Timeout as e:
        raise HorovodInternalTimeout(str(e)) from e
    except CommError as e:
        raise HorovodInternalError(str(e)) from e
    except RuntimeError as e:
        if _is_comm_failure(e):
            raise HorovodInternalError(f"torch.distributed: {e}") from e
        raise
