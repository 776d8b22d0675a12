"""Process sets (Horovod's ``ProcessSet``, ``global_process_set``, ``add_process_set``, ``remove_process_set``) and
the collectives of gradcomp.torch's Python API over one of them: allreduce (sum, min, max, product of any dtype),
allgather (fixed and variable first dimension), alltoallv, broadcast, barrier.

A process set is a subset of the world's ranks with its own C++ Communicator, which the backend builds
(backends.py: a ``Communicator.split`` of the MPI world, or a TorchCommunicator over a ``torch.distributed.new_group``).
Creating and removing one is collective over the whole world (every rank calls add_process_set with the same ranks, in
the same order, as in Horovod). What other modules use (e.g. DistributedOptimizer(process_set=...)):

- ``ps.ranks`` (global ranks, sorted), ``ps.size()``, ``ps.rank()`` (rank inside the set), ``ps.included()``;
- ``ps.communicator()``: the set's C++ Communicator (the global set's is the world's, ``_ctx.comm``);
- ``_resolve(ps)``: the set, checked (initialized, this rank a member), global_process_set for None.
The collectives themselves (comm_ops.py) are written once against a Communicator, whatever the backend.
The fusion runtime runs on the world only: a process set's tensors on the runtime backend go through its communicator.
"""
from .context import _ctx, _require_init
from .errors import _internal_errors


class ProcessSet:
    """A subset of ranks (global ranks) that run collectives together; register it with add_process_set()."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks):
        ranks = sorted(int(r) for r in ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet: duplicate ranks in {ranks}")
        self.ranks = ranks
        self._comm = None
        self._native = None  # the backend's own handle of the set (the torch group), for backends.py alone

    def _invalidate(self):
        self.process_set_id = None
        self._comm = None
        self._native = None

    def size(self):
        """The number of ranks in the set, None if it is not registered."""
        if self.process_set_id is None:
            return None
        return len(_ranks_of(self))

    def rank(self):
        """This process's rank inside the set (None if not registered; -1... raises if not a member)."""
        if self.process_set_id is None:
            return None
        ranks = _ranks_of(self)
        return ranks.index(_ctx.rank) if _ctx.rank in ranks else None

    def included(self):
        if self.ranks is None and self is not global_process_set:
            return None
        return _ctx.rank in _ranks_of(self)

    def communicator(self):
        """The set's C++ Communicator (None on a rank outside it). It refuses a collective join() does not serve while
        a member is joined (join_notes.Notes.check_served: join() serves the global set's allreduces and steps only)."""
        if _ctx.notes is not None:
            _ctx.notes.check_served(None if self is global_process_set else _ranks_of(self))
        return _ctx.comm if self is global_process_set else self._comm

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id \
            and self.process_set_id is not None

    def __hash__(self):
        return hash(self.process_set_id)

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={_ranks_of(self)})"

    __repr__ = __str__


def _ranks_of(ps):
    if ps is global_process_set:
        return list(range(_ctx.size))
    return ps.ranks


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_registry = {}   # id -> ProcessSet (the global set is not in it)
_next_id = [1]


def _reset():
    """shutdown(): every added set becomes invalid (init() starts with the global set only, as in Horovod)."""
    for ps in _registry.values():
        ps._invalidate()
    _registry.clear()
    _next_id[0] = 1


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of global ranks) and returns it. Collective over all ranks."""
    _require_init()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = process_set.ranks
    if not ranks or any(r < 0 or r >= _ctx.size for r in ranks):
        raise ValueError(f"add_process_set: ranks {ranks} must be a non-empty subset of 0..{_ctx.size - 1}")
    if ranks == list(range(_ctx.size)) or any(p.ranks == ranks for p in _registry.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    member = _ctx.rank in ranks
    with _internal_errors():
        process_set._comm, process_set._native = _ctx.impl.split(ranks, member)
    process_set.process_set_id = _next_id[0]
    _next_id[0] += 1
    _registry[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregisters an added set (collective); False for the global set or one not registered."""
    if process_set is None or process_set.process_set_id in (None, 0) \
            or _registry.get(process_set.process_set_id) is not process_set:
        return False
    with _internal_errors():
        _ctx.comm.barrier()
    del _registry[process_set.process_set_id]
    process_set._invalidate()
    return True


def _resolve(ps):
    _require_init()
    if ps is None or ps is global_process_set:
        return global_process_set
    if not isinstance(ps, ProcessSet) or ps.process_set_id is None:
        raise ValueError(f"process_set {ps} is not registered: add it with add_process_set()")
    if _ctx.rank not in ps.ranks:
        raise ValueError(f"rank {_ctx.rank} is not a member of {ps}")
    return ps


