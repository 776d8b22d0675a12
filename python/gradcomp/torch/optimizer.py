"""DistributedOptimizer: wraps a torch optimizer so that step() applies gradients averaged (or summed) over all ranks,
each compressed with a codec. Each gradient's allreduce is launched from its accumulator hook during backward, on
the backend init() chose (backends.py); the compressor state rides in state_dict() (gradcomp._optimizer_state).

Horovod's options (horovod.torch 0.28.1 semantics):

- ``op=Adasum``: optimizer_adasum.py (the delta optimizer: local step, Adasum of the parameter deltas);
- ``gradient_predivide_factor=f`` (op=Average only): each gradient is multiplied by 1/f before the sum and by f/size
  after it;
- ``groups`` (a number of groups, or lists of parameters) / ``num_groups`` (the older name): the allreduces of a
  group's parameters are launched together, in the group's order, once the last of them has its gradient (Horovod's
  grouped allreduce: each tensor still compressed on its own); a number n splits the parameters, in order, into n
  groups as Horovod's split_list does;
- sparse gradients (``Embedding(sparse=True)``): allgather of every rank's indices and values (values / size for
  Average; compression does not apply), or with ``sparse_as_dense=True`` densified, reduced like any gradient and
  made sparse again (optimizer_sparse.py);
- ``set_backward_passes_per_step(n)``; a parameter that needs a gradient and has none at step() sends zeros, as
  Horovod's synchronize does (another rank may have one);
- ``process_set=``: a registered set (``hvd.add_process_set``): the optimizer lives on its members and reduces over
  the set's communicator (torch backend: its group; runtime backend: the set's MPI communicator, as the fusion
  runtime runs on the world); sparse gradients then need ``sparse_as_dense``; Adasum and SyncBatchNorm take the
  global set only;
- ``compression=``: a gradcomp spec (``Compression.topk(0.01)``, ``"qsgd:bits=4"``), ``Compression.none`` /
  ``Compression.fp16`` (Horovod compressor objects that keep the C++ codecs), or any Horovod-style compressor class
  or object (``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx)``), used as is;
- ``hvd.join()`` (uneven data): on the runtime backend the fusion runtime's negotiation serves a joined rank;
  elsewhere each gradient's exchange (global set, not Adasum) is an operation join() serves (join_notes.py): nothing
  is sent while no rank is joined, and a joined rank, told of each exchange by a note, takes part with a zero
  gradient (_join_replay). Steps keep their overlap with backward either way.
"""
import contextlib
import os

import torch

from .. import _optimizer_state
from .._compressors import Compression, InvalidArgument, owned_compressor
from .._gradcomp import Error
from .backends import _exchange_view, current as _backend
from . import grad_hooks
from . import join_protocol as _join
from . import optimizer_sparse
from .context import Adasum, Average, _check_op, _ctx, _require_init, new_scope
from .errors import _internal_errors

_GROUP_WAIT = object()  # a grouped parameter whose gradient is ready, waiting for the rest of its group
_SPARSE_WAIT = object()  # a sparse gradient, gathered in synchronize() after the dense allreduces completed


class _Finish:
    """A launched allreduce and what completes it after wait() (postscale, a sparse gradient's write-back); `ended`
    runs once the wait returns or raises (join's count of open operations)."""

    def __init__(self, handle, then=None, ended=None):
        self.handle, self.then, self.ended = handle, then, ended

    def wait(self):
        try:
            self.handle.wait()
        finally:
            if self.ended is not None:
                self.ended()
        if self.then is not None:
            self.then()


def _split_list(items, n):
    """Horovod's split_list: n consecutive groups whose sizes differ by at most one, the first ones larger."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def check_process_set(process_set, what="DistributedOptimizer"):
    """None for the global process set; other sets raise (Adasum and SyncBatchNorm: the global set only)."""
    if process_set is None:
        return None
    pid = getattr(process_set, "process_set_id", None)
    ranks = getattr(process_set, "ranks", None)
    if pid == 0 or (ranks is not None and list(ranks) == list(range(_ctx.size))):
        return None
    raise InvalidArgument(f"{what}: process_set={process_set!r}: only the global process set is supported here "
                          "(pass process_set=None or hvd.global_process_set)")


def resolve_process_set(process_set):
    """None for the global set, else the registered set (ValueError when it is not registered or this rank is not a
    member: a process set's optimizer lives on its members only, as in Horovod)."""
    if check_process_set_is_global(process_set):
        return None
    from .process_sets import _resolve
    return _resolve(process_set)


def check_process_set_is_global(process_set):
    pid = getattr(process_set, "process_set_id", None)
    ranks = getattr(process_set, "ranks", None)
    return process_set is None or pid == 0 or (ranks is not None and list(ranks) == list(range(_ctx.size)))


class _DistributedOptimizer(torch.optim.Optimizer):
    def _gradcomp_setup(self, named_parameters, compression, backward_passes_per_step, op,
                        gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False, process_set=None):
        _require_init()
        self._op = op if op == Adasum else _check_op(op)  # Adasum here: one rank (the identity)
        self._compression = compression
        self._compressor = owned_compressor(compression)
        self._scope = new_scope("optimizer")
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = bool(sparse_as_dense)
        self._process_set = resolve_process_set(process_set)
        self._set_size = _ctx.size if self._process_set is None else self._process_set.size()
        self._groups = groups
        self._p_to_group = {}
        self.set_backward_passes_per_step(backward_passes_per_step)
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise InvalidArgument("DistributedOptimizer: named_parameters has duplicate names")
            self._names = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(all_params) if id(p) not in self._names]
            if missing:
                raise InvalidArgument(f"DistributedOptimizer: {len(missing)} optimizer parameters are missing from "
                                      "named_parameters")
        else:
            self._names = {}
            for gi, group in enumerate(self.param_groups):
                for pi, p in enumerate(group["params"]):
                    self._names[id(p)] = f"allreduce.noname.{gi}.{pi}"
        self._step_count_gc = 0
        self._handles = {}
        self._should_sync = True
        self._synchronized = False
        self._hook_handles = []
        self._grad_accs = []
        self._join_key = None  # (CRC of the parameter names, their count) once, not per step
        self._join_params = []  # every parameter of param_groups, in order (a note's "i" indexes them)
        self._join_index = {}  # id(p) -> its position there
        # Dense exchanges need notes unless the runtime negotiates them; sparse gathers always do.
        self._notes_for_dense = not _join.negotiated(self._compressor)
        if self._process_set is None and op != Adasum and _ctx.size > 1:
            # Frozen ones too (requires_grad may change later); the order is the same on every rank.
            self._join_key = (_join.optimizer_key([self._names[id(p)] for p in all_params]), len(all_params))
            self._join_params = all_params
            self._join_index = {id(p): i for i, p in enumerate(all_params)}
            _join.register(self)
        if self._set_size > 1 or os.environ.get("GRADCOMP_FORCE_HOOKS"):
            self._register_hooks()

    def set_backward_passes_per_step(self, passes):
        """Gradients are reduced every `passes` backward passes (accumulated locally in between, then divided by
        `passes`); resets the count of passes."""
        passes = int(passes)
        if passes < 1:
            raise InvalidArgument(f"DistributedOptimizer: backward_passes_per_step must be >= 1, got {passes}")
        self._backward_passes_per_step = passes
        self.backward_passes_per_step = passes  # Horovod's attribute
        self._passes = {}

    def _form_groups(self, p_list):
        groups = self._groups
        if groups is None or groups == 0:
            return
        if isinstance(groups, (list, tuple)):
            ids = {id(p) for p in p_list}
            p_groups, grouped = [], set()
            for g in groups:
                p_groups.append([p for p in g if id(p) in ids])
                grouped.update(id(p) for p in p_groups[-1])
            p_groups += [[p] for p in p_list if id(p) not in grouped]
        else:
            p_groups = _split_list(p_list, groups)
        for g in p_groups:
            if g:
                members = tuple(g)
                for p in members:
                    self._p_to_group[id(p)] = members

    def _register_hooks(self):
        self._form_groups([p for group in self.param_groups for p in group["params"] if p.requires_grad])
        self._hook_handles, self._grad_accs = grad_hooks.register(
            [p for group in self.param_groups for p in group["params"]], self._on_grad)

    def _remove_hooks(self):
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        self._grad_accs = []

    def _on_grad(self, p):
        if p.grad is None:
            return
        if id(p) in self._handles and self._handles[id(p)] is not None:
            raise Error(f"gradcomp DistributedOptimizer: gradient of '{self._names[id(p)]}' computed twice before "
                        "step(); use backward_passes_per_step or optimizer.synchronize()")
        passes = self._passes.get(id(p), 0) + 1
        self._passes[id(p)] = passes
        if passes < self._backward_passes_per_step:
            return
        group = self._p_to_group.get(id(p))
        if group is None:
            self._handles[id(p)] = self._allreduce_grad(p)
            return
        self._handles[id(p)] = _GROUP_WAIT
        if all(self._handles.get(id(q)) is _GROUP_WAIT for q in group):
            for q in group:  # Horovod's grouped allreduce: the group's tensors launched together, in its order
                self._handles[id(q)] = self._allreduce_grad(q)

    def _served(self, p, kind):
        """The OP note descriptor of parameter p's exchange (join_notes.py), or None when join does not serve this
        optimizer (process set, Adasum, one rank)."""
        if self._join_key is None:
            return None
        note = {"k": kind, "key": self._join_key[0], "i": self._join_index[id(p)], "s": self._step_count_gc}
        if kind == "sparse":
            note["sd"] = p.grad.sparse_dim()
        return note

    def _join_replay(self, note):
        """On a joined rank: parameter note["i"]'s exchange of the others' step note["s"] with a zero gradient (dense,
        or a sparse one with no entries); this rank's parameters and gradients are untouched."""
        p = self._join_params[note["i"]]
        self._step_count_gc = note["s"]
        with _internal_errors():
            if note["k"] == "sparse":
                sd = note["sd"]
                empty = torch.sparse_coo_tensor(torch.zeros((sd, 0), dtype=torch.int64),
                                                torch.zeros((0, *p.shape[sd:]), dtype=p.dtype), p.shape)
                optimizer_sparse.gather_sparse(empty, self._op)
            else:
                self._reduce_dense(torch.zeros(p.shape, dtype=p.dtype, device=p.device), self._names[id(p)]).wait()
        self._step_count_gc = note["s"] + 1  # the others' count after their step (seeds keyed by step stay agreed)

    def _params_in_order(self):
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def _allreduce_grad(self, p):
        self._passes[id(p)] = 0
        grad = p.grad
        if self._backward_passes_per_step > 1:
            grad.div_(self._backward_passes_per_step)
        name = self._names[id(p)]
        if grad.is_sparse:
            if not self._sparse_as_dense:
                if self._process_set is not None:
                    raise InvalidArgument(f"DistributedOptimizer: parameter '{name}' has a sparse gradient, gathered "
                                          f"over the world only: with process_set={self._process_set} pass "
                                          f"sparse_as_dense=True")
                return _SPARSE_WAIT  # gathered in synchronize(), after the dense allreduces (one thread per group)
            dense = grad.to_dense()
            return self._launch(p, dense, name, lambda: p.grad.zero_().add_(self._postscale(dense).to_sparse()))
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        return self._launch(p, grad, name, lambda: self._postscale(grad))

    def _launch(self, p, grad, name, then):
        """Parameter p's exchange of `grad`, as one operation join() serves (ended when its handle is waited for)."""
        n = _join.begin(self._served(p, "grad")) if self._join_key is not None and self._notes_for_dense else 0
        try:
            handle = self._reduce_dense(grad, name)
        except BaseException:
            _join.end(n)
            raise
        return _Finish(handle, then, ended=lambda: _join.end(n))

    def _postscale(self, grad):
        if self._predivide != 1.0 and self._op == Average:
            grad.mul_(self._predivide / self._set_size)
        return grad

    def _reduce_dense(self, grad, name):
        op = self._op
        if self._predivide != 1.0 and op == Average:
            # Horovod: prescale 1/f, sum, postscale f/size (postscaled() after wait()).
            grad.mul_(1.0 / self._predivide)
            op = "sum"
        return _backend().allreduce(self._compressor, name, _exchange_view(grad, self._compressor),
                                        self._step_count_gc, op, self._process_set, scope=self._scope)

    def synchronize(self):
        """Waits for every gradient's allreduce (launching those whose hooks did not fire)."""
        if self._set_size > 1:
            params = self._params_in_order()
            for p in params:
                if self._handles.get(id(p)) in (None, _GROUP_WAIT):
                    if p.grad is None:  # as Horovod: another rank may have a gradient for it (a dynamic forward)
                        p.grad = torch.zeros_like(p)
                    self._handles[id(p)] = self._allreduce_grad(p)
            with _internal_errors():  # a failed exchange is Horovod's HorovodInternalError (elastic.run resets)
                for h in self._handles.values():
                    if h is not None and h is not _SPARSE_WAIT:
                        h.wait()
            for p in params:
                if self._handles.get(id(p)) is _SPARSE_WAIT:
                    with _join.served(self._served(p, "sparse")) if self._join_key is not None \
                            else contextlib.nullcontext():
                        optimizer_sparse.allgather_sparse_grad(p, self._op)
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, step() does not synchronize (call synchronize() yourself first, e.g. for gradient clipping)."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._should_sync:
            if self._synchronized and not self._handles:
                pass  # synchronize() was called explicitly
            else:
                self.synchronize()
        self._synchronized = False
        self._step_count_gc += 1
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise Error("gradcomp DistributedOptimizer: zero_grad() called between backward() and step(); call "
                        "step() or synchronize() first")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def state_dict(self):
        """The wrapped optimizer's state plus "gradcomp": this rank's compressor state (see _optimizer_state.save)."""
        sd = super(self.__class__, self).state_dict()
        sd["gradcomp"] = _optimizer_state.save(self, _ctx)
        return sd

    def load_state_dict(self, state_dict):
        """Restores this rank's own state_dict(); a failed load changes nothing (see _optimizer_state.load)."""
        state_dict = dict(state_dict)
        gc = state_dict.pop("gradcomp", None)
        load_wrapped = lambda: super(self.__class__, self).load_state_dict(state_dict)  # noqa: E731
        if gc is None:
            load_wrapped()
        else:
            _optimizer_state.load(self, gc, _ctx, load_wrapped)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=None, exchange="gradient", exchange_options=None, **_horovod_only):
    """Wraps `optimizer` so that step() applies gradients averaged over all ranks, each compressed with
    `compression` (``gradcomp.Compression.topk(0.01)``, ``Compression.fp16``, a spec string, a Python-registered
    codec or a Horovod-style compressor object). The returned object is an instance of the original optimizer's class
    (as in horovod.torch) and its state_dict() includes the compressor state (residuals), so checkpoint/resume
    reproduces the uninterrupted run. Horovod's other arguments: see this module's docstring; ``op=Adasum`` returns
    the delta optimizer of optimizer_adasum.py (on more than one rank).

    ``exchange="momentum"`` (torch.optim.Adam or AdamW only): compress the optimizer's momentum instead of the
    gradient, after a warm-up of exact steps (1-bit Adam / 0/1 Adam, for every codec): returns a
    gradcomp.torch.CompressedAdam over the optimizer's parameter groups, ``exchange_options`` its keywords (warmup,
    variance, exact_compression, precondition, guard, overlap).
    """
    _require_init()
    if exchange not in ("gradient", "momentum"):
        raise InvalidArgument(f"DistributedOptimizer: exchange must be 'gradient' or 'momentum', got {exchange!r}")
    if exchange == "momentum":
        _check_momentum_exchange(op, backward_passes_per_step, gradient_predivide_factor, num_groups or groups,
                                 sparse_as_dense, process_set)
        from .compressed_adam import from_torch_optimizer
        return from_torch_optimizer(optimizer, named_parameters, compression, **(exchange_options or {}))
    if gradient_predivide_factor != 1.0 and op != Average:
        raise InvalidArgument("DistributedOptimizer: gradient_predivide_factor not supported with op != Average")
    if gradient_predivide_factor <= 0:
        raise InvalidArgument(f"DistributedOptimizer: gradient_predivide_factor must be > 0, got "
                              f"{gradient_predivide_factor}")
    if num_groups != 0 and groups is None:
        groups = num_groups  # Horovod's older name
    _check_groups(groups)
    if op == Adasum and _ctx.size > 1:
        from .optimizer_adasum import _DistributedAdasumOptimizer
        check_process_set(process_set, "DistributedOptimizer(op=Adasum)")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        wrapped = cls.__new__(cls)
        wrapped.__dict__.update(optimizer.__dict__)
        wrapped._adasum_setup(named_parameters, compression, backward_passes_per_step)
        return wrapped
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._gradcomp_setup(named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                            groups, sparse_as_dense, process_set)
    return wrapped


def _check_groups(groups):
    if groups is None:
        return
    if isinstance(groups, bool) or not (isinstance(groups, (list, tuple)) or (isinstance(groups, int) and groups >= 0)):
        raise InvalidArgument("DistributedOptimizer: groups should be a non-negative integer or a list of lists of "
                              f"torch.Tensor, got {groups!r}")
    if isinstance(groups, (list, tuple)):
        seen = set()
        for g in groups:
            if not isinstance(g, (list, tuple)):
                raise InvalidArgument(f"DistributedOptimizer: groups must be lists of torch.Tensor, got {g!r}")
            for p in g:
                if not isinstance(p, torch.Tensor):
                    raise InvalidArgument("DistributedOptimizer: groups must consist of torch.Tensor")
                if id(p) in seen:
                    raise InvalidArgument("DistributedOptimizer: a parameter can only appear once in groups")
                seen.add(id(p))


def _check_momentum_exchange(op, passes, predivide, groups, sparse_as_dense, process_set):
    """exchange="momentum" averages every momentum over the world once per step: Horovod's options that change what
    is reduced, or how often, do not apply."""
    given = [name for name, bad in (("op", op != Average), ("backward_passes_per_step", passes != 1),
                                    ("gradient_predivide_factor", predivide != 1.0), ("groups", bool(groups)),
                                    ("sparse_as_dense", sparse_as_dense),
                                    ("process_set", not check_process_set_is_global(process_set))) if bad]
    if given:
        raise InvalidArgument(f"DistributedOptimizer(exchange='momentum'): {', '.join(given)} not supported (the "
                              "momentum of every parameter is averaged over all ranks at every step)")
