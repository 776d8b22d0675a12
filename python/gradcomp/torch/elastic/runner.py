"""@run: the loop that re-enters the training function after a reset (horovod.common.elastic.run_fn's semantics).

- HorovodInternalError (or another gradcomp.CommError / Timeout: a collective failed, a peer is gone): the state goes
  back to its last commit. In a worker of torchrun's elastic agent the process then exits (code RESTART_EXIT_CODE):
  a process group cannot shrink or grow in place, so the agent re-forms the job with a new WORLD_SIZE and RANK, and
  the new process resumes from the commit on disk (membership.resume). Elsewhere (the torch backend without
  torchrun) gradcomp is re-initialized in the process (shutdown() + init()), the reset callbacks run, and the
  function is entered again after sync(); at most GRADCOMP_ELASTIC_MAX_RESETS times (default 16), then it raises.
- HostsUpdatedInterrupt (raised by commit() on every rank): reset without restoring, sync unless skip_sync.
The MPI and runtime backends are not elastic (an MPI world cannot shrink or grow under mpirun): their errors are
raised as they are."""
import functools
import os
import sys

from ..._gradcomp import CommError, Timeout
from ..context import _ctx
from ..errors import HostsUpdatedInterrupt, _is_comm_failure
from .commits import under_torchrun
from .membership import resume

RESTART_EXIT_CODE = 75  # EX_TEMPFAIL: the agent restarts the worker (any non-zero code does)


def _log(msg):
    print(f"gradcomp.elastic: rank {_ctx.rank}: {msg}", file=sys.stderr, flush=True)


def _exit_for_restart(error):
    """Leaves the process for torchrun to restart it; os._exit, because the broken process group cannot take part
    in the orderly teardown at exit (a barrier)."""
    _log(f"{type(error).__name__}: {error}; exiting (code {RESTART_EXIT_CODE}) for torchrun to re-form the job "
         "and resume from the last commit")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESTART_EXIT_CODE)


def _reset():
    """gradcomp re-initialized in this process, on the backend it had."""
    from ..launch import init, shutdown
    backend = _ctx.impl.name
    shutdown()
    init(backend=backend)


def run_fn(func, reset=_reset):
    """`func(state, *args, **kwargs)` run elastically (see the module's docstring); `reset` re-initializes the
    communication between attempts."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if _ctx.impl is not None and not _ctx.impl.elastic:
            from ..._compressors import InvalidArgument
            raise InvalidArgument(f"gradcomp.torch.elastic.run: the '{_ctx.impl.name}' backend is not elastic (an MPI "
                                  "world cannot shrink or grow under mpirun); use backend='torch' under torchrun")
        max_resets = int(os.environ.get("GRADCOMP_ELASTIC_MAX_RESETS", 16))
        resets, reset_required, skip_sync, first = 0, False, False, True
        while True:
            try:
                if reset_required:
                    reset()
                    state.on_reset()
                if first:
                    first = False
                    disk = getattr(state, "_disk", None)
                    if disk is not None and resume(state, disk) is not None:
                        state.on_reset()  # a restarted process: the world may have another size
                        state.sync()
                        state.save()
                        skip_sync = True
                if not skip_sync:
                    state.sync()
                skip_sync = False
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:  # a RuntimeError: before the clause below
                skip_sync = e.skip_sync
            except (CommError, Timeout, RuntimeError) as e:
                if not isinstance(e, (CommError, Timeout)) and not _is_comm_failure(e):
                    raise  # a RuntimeError of the user's code, not of a collective
                if under_torchrun():
                    _exit_for_restart(e)
                resets += 1
                if resets > max_resets:
                    raise
                _log(f"{type(e).__name__}: {e}; restoring the last commit and re-initializing ({resets}/{max_resets})")
                state.restore()
            reset_required = True

    return wrapper
