"""The state objects of gradcomp.torch.elastic, with horovod's semantics (horovod.common.elastic.State/ObjectState,
horovod.torch.elastic.TorchState): commit() keeps a copy in memory (restore() returns to it after a failed step),
sync() makes every rank's state rank 0's after a reset. TorchState also writes each commit to disk, one file per rank
(gradcomp.torch.elastic.commits), so a process that torchrun restarts after a membership change resumes from it."""
import queue

from ..context import _ctx, rank
from ..objects import allgather_object, broadcast_object
from .commits import DiskCommits
from .handlers import split_handlers


class State:
    """Base of the state objects: reset callbacks, host-update notifications and the commit protocol.
    `bcast_object(obj)` returns rank 0's `obj` on every rank; `get_rank()` this process's rank."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every reset (ranks added or removed), e.g. to scale the learning
        rate with the new hvd.size(); also after a restarted process resumed from a commit on disk."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = queue.Queue()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res=None):
        """Notification that hosts will be added or removed (Horovod's driver sends it; under torchrun the elastic
        agent restarts the workers itself and nothing calls this). The next check_host_updates() raises."""
        self._host_messages.put(timestamp)

    def commit(self):
        """Saves the state (in memory, and on disk for TorchState) and then checks for host updates, raising
        HostsUpdatedInterrupt when there were some. Commits cost a copy (and a disk write): commit every few steps
        rather than every step when steps are short; a failure loses the steps since the last commit."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when any rank was notified of a host update since the last
        check (the ranks agree on the newest timestamp first, so they all raise at the same commit)."""
        from ..errors import HostsUpdatedInterrupt
        prev = last = self._last_updated_timestamp
        while not self._host_messages.empty():
            last = max(last, self._host_messages.get())
        if _ctx.size > 1:
            last = max(allgather_object(last, name="elastic.hosts_updated"))
        self._last_updated_timestamp = last
        if last > prev:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        """Saves the state in memory."""
        raise NotImplementedError

    def restore(self):
        """Returns to the last saved state, undoing uncommitted changes."""
        raise NotImplementedError

    def sync(self):
        """Makes every rank's state rank 0's."""
        raise NotImplementedError


class ObjectState(State):
    """State of plain Python values, given as keyword arguments and kept as attributes (``state.epoch``)."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def _bcast(obj):
    return broadcast_object(obj, 0, name="elastic.objects")


class TorchState(ObjectState):
    """State of a PyTorch training process: `model` and `optimizer` (any number of models, optimizers, LR schedulers
    and ElasticSamplers may be given as keyword arguments, each handled by its type's handler; other values are kept
    as plain objects). commit() also writes this rank's state to disk when a commit directory is set (by
    set_commit_dir(), GRADCOMP_ELASTIC_DIR, or by default under torchrun's elastic agent; see docs/elastic.md),
    including the DistributedOptimizer's compressor state (residuals, momenta) of this rank."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = split_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=_bcast, get_rank=rank, **kwargs)
        self._disk = DiskCommits.from_environment()

    def set_commit_dir(self, directory, keep=2):
        """Writes every commit to `directory` (one file per rank, the newest `keep` commits kept); None: memory
        only. Call before the @run function; a restarted process resumes from the newest complete commit there."""
        self._disk = None if directory is None else DiskCommits(directory, keep)

    @property
    def commit_dir(self):
        return None if self._disk is None else self._disk.store.directory

    def commit(self):
        self.save()
        if self._disk is not None:
            self._disk.write(self)
        self.check_host_updates()

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        # Optimizers first: broadcast_optimizer_state may create a fresh optimizer's state with a local step, which
        # must not leave the parameters different (the models are broadcast after it).
        order = sorted(self._handlers.items(), key=lambda kv: type(kv[1]).__name__ != "OptimizerStateHandler")
        for _, handler in order:
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in getattr(self, "_handlers", {}):
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)
