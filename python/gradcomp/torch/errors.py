"""Horovod's error classes, mapped onto gradcomp's: a collective of gradcomp.torch that fails in communication raises
HorovodInternalError, a subclass of gradcomp.CommError (a timeout: also a gradcomp.Timeout), so both Horovod's
``except hvd.HorovodInternalError`` and gradcomp's ``except gradcomp.CommError`` catch it."""
import contextlib

from .._gradcomp import CommError, Timeout


class HorovodInternalError(CommError):
    """A collective failed (a peer died, the communicator broke, a deadline passed): as horovod.common.exceptions."""


class HorovodInternalTimeout(HorovodInternalError, Timeout):
    """A collective did not complete within the communicator's timeout."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's signal that the host set changed. gradcomp has no elastic mode, so nothing raises it; it
    exists so that ``except hvd.HostsUpdatedInterrupt`` in a Horovod script resolves."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


@contextlib.contextmanager
def _internal_errors():
    """Re-raises gradcomp's CommError / Timeout (and torch.distributed's communication failures) as
    HorovodInternalError, keeping the original as __cause__."""
    try:
        yield
    except HorovodInternalError:
        raise
    except Timeout as e:
        raise HorovodInternalTimeout(str(e)) from e
    except CommError as e:
        raise HorovodInternalError(str(e)) from e
