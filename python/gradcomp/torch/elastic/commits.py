"""TorchState's commits on disk: what one rank writes at each commit, where, and under which identity.

Each rank writes its own file per commit (store.CommitStore: atomic, keep-last-N): the handlers' saved states (model,
wrapped optimizer, schedulers, samplers), the plain values, this rank's compressor state of each DistributedOptimizer
and DDP HookState (their envelopes: residuals, momenta, step counters) with the gradient norm at the commit, and the rank's
identity (the host and torchrun agent that ran it), by which a restarted process finds its own residual again
(membership.resume)."""
import getpass
import os
import socket
import tempfile

from ..context import _ctx
from .store import CommitStore

DEFAULT_KEEP = 2


def under_torchrun():
    """True in a worker started by torchrun's elastic agent (it sets TORCHELASTIC_RUN_ID)."""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID"))


def identity():
    """What stays the same for one node while torchrun restarts its worker: GRADCOMP_ELASTIC_ID when set, else the
    host name and the process id of the parent (torchrun's agent; outside torchrun: this process's own id)."""
    explicit = os.environ.get("GRADCOMP_ELASTIC_ID")
    if explicit:
        return explicit
    pid = os.getppid() if under_torchrun() else os.getpid()
    return f"{socket.gethostname()}:{pid}"


class DiskCommits:
    """Writes a TorchState's commits to a CommitStore; `seq` is the next commit's number (the same on every rank:
    agreed in membership.resume on the first entry of @run)."""

    def __init__(self, directory, keep=DEFAULT_KEEP):
        self.store = CommitStore(directory, keep)
        self.seq = None  # set by membership.resume
        self.resumed = None  # set by membership.resume: {"seq", "world_size", "skipped"}

    @staticmethod
    def from_environment():
        """GRADCOMP_ELASTIC_DIR (and GRADCOMP_ELASTIC_KEEP); under torchrun without it, a folder named after the
        user and torchrun's run id (--rdzv_id) in the temporary directory; else None (commits in memory only)."""
        keep = int(os.environ.get("GRADCOMP_ELASTIC_KEEP", DEFAULT_KEEP))
        directory = os.environ.get("GRADCOMP_ELASTIC_DIR")
        if not directory and under_torchrun():
            run_id = os.environ["TORCHELASTIC_RUN_ID"]
            directory = os.path.join(tempfile.gettempdir(), f"gradcomp-elastic-{getpass.getuser()}-{run_id}")
        return DiskCommits(directory, keep) if directory else None

    def write(self, state):
        """This rank's file of the next commit of `state` (its handlers' and values' last save())."""
        if self.seq is None:
            raise RuntimeError("gradcomp.torch.elastic: TorchState.commit() to disk outside @elastic.run (the commit "
                               "number is agreed when the run function is entered)")
        handlers, codecs, stats = {}, {}, {}
        for name, handler in state._handlers.items():
            handlers[name] = handler.committed()
            envelope = handler.codec_envelope() if hasattr(handler, "codec_envelope") else None
            if envelope is not None:
                codecs[name] = envelope
                stats[name] = {"grad_norm": handler.grad_norm()}
        payload = {"identity": identity(), "handlers": handlers, "objects": dict(state._saved_state),
                   "codecs": codecs, "stats": stats}
        self.store.write(self.seq, _ctx.rank, _ctx.size, payload)
        self.seq += 1

    def __repr__(self):
        return f"DiskCommits({self.store.directory!r}, keep={self.store.keep}, next={self.seq})"

