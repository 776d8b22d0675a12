"""DistributedOptimizer: wraps a torch optimizer so that step() applies gradients averaged (or summed) over all ranks,
each compressed with a codec. Each gradient's allreduce is launched from its accumulator hook during backward, on
the backend init() chose (backends.py); the compressor state rides in state_dict() (gradcomp._optimizer_state)."""
import contextlib
import os

import torch

from .. import _optimizer_state
from .._compressors import Compression, InvalidArgument, compressor
from .._gradcomp import Error
from .backends import _Backend, _exchange_view
from .context import Average, _check_op, _ctx, _require_init


class _DistributedOptimizer(torch.optim.Optimizer):
    def _gradcomp_setup(self, named_parameters, compression, backward_passes_per_step, op):
        _require_init()
        self._op = _check_op(op)
        self._compression = compression
        self._compressor = compressor(compression)
        self._backward_passes_per_step = int(backward_passes_per_step)
        if self._backward_passes_per_step < 1:
            raise InvalidArgument(f"DistributedOptimizer: backward_passes_per_step must be >= 1, got "
                                  f"{backward_passes_per_step}")
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
        self._passes = {}
        self._should_sync = True
        self._synchronized = False
        self._hook_handles = []
        self._grad_accs = []
        if _ctx.size > 1 or os.environ.get("GRADCOMP_FORCE_HOOKS"):
            self._register_hooks()

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                if hasattr(p, "register_post_accumulate_grad_hook"):
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_post_hook(p)))
                else:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._hook_handles.append(acc.register_hook(self._make_acc_hook(p)))
                    self._grad_accs.append(acc)

    def _remove_hooks(self):
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        self._grad_accs = []

    def _make_acc_hook(self, p):
        def hook(*_):
            self._on_grad(p)
        return hook

    def _make_post_hook(self, p):
        def hook(_):
            self._on_grad(p)
        return hook

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
        self._handles[id(p)] = self._allreduce_grad(p)

    def _allreduce_grad(self, p):
        self._passes[id(p)] = 0
        grad = p.grad
        if self._backward_passes_per_step > 1:
            grad.div_(self._backward_passes_per_step)
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        return _Backend.get().allreduce(self._compressor, self._names[id(p)], _exchange_view(grad, self._compressor),
                                        self._step_count_gc, self._op)

    def synchronize(self):
        """Waits for every gradient's allreduce (launching those whose hooks did not fire)."""
        if _ctx.size > 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad and p.grad is not None and self._handles.get(id(p)) is None:
                        self._handles[id(p)] = self._allreduce_grad(p)
            for h in self._handles.values():
                if h is not None:
                    h.wait()
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
                         op=Average, gradient_predivide_factor=1.0, **_horovod_only):
    """Wraps `optimizer` so that step() applies gradients averaged over all ranks, each compressed with
    `compression` (``gradcomp.Compression.topk(0.01)``, ``Compression.fp16``, a spec string or a Python-registered
    codec). The returned object is an instance of the original optimizer's class (as in horovod.torch) and its
    state_dict() includes the compressor state (residuals), so checkpoint/resume reproduces the uninterrupted run.
    """
    if gradient_predivide_factor != 1.0:
        raise InvalidArgument("DistributedOptimizer: gradient_predivide_factor is not supported")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._gradcomp_setup(named_parameters, compression, backward_passes_per_step, op)
    return wrapped
