"""How TorchState keeps each kind of value it tracks: a model, an optimizer, an LR scheduler, an ElasticSampler, the
DDP hook's HookState.
Each handler saves the value in memory (commit), restores the saved copy (after a failure), synchronizes it from rank 0
(after a reset) and gives / takes the part written to disk (`committed()`, `load_committed()`, used on rank 0 when a
restarted process resumes from disk). The optimizer's compressor state (residuals) is per rank: it stays out of the
broadcast and is moved by gradcomp.torch.elastic.membership."""
import copy
import math

import torch

from ..._compressors import InvalidArgument
from ..context import _ctx
from ..hook import HookState
from ..objects import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler


class StateHandler:
    """Base: `value` is the tracked object; set_value() replaces it and saves it. The defaults keep a deep copy of
    value.state_dict() (save), load it back (restore) and commit it to disk as it is (committed)."""

    def __init__(self, value):
        self.value = value

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        raise NotImplementedError

    def committed(self):
        """What of the last save() goes to disk (a torch.save-able object)."""
        return self._saved

    def load_committed(self, saved, name):
        """Loads committed() of another process (rank 0 of a restarted job); `name` is the state attribute."""
        raise NotImplementedError

    def set_value(self, value):
        self.value = value
        self.save()


def check_model_state(saved, model_state, name):
    """InvalidArgument naming the first parameter or buffer whose name or shape differs between a committed model
    state and the model's."""
    for key, tensor in model_state.items():
        if key not in saved:
            raise InvalidArgument(f"elastic restore of '{name}': parameter '{key}' of the model is not in the commit "
                                  "(the commit was made by another model)")
        got = tuple(saved[key].shape) if torch.is_tensor(saved[key]) else None
        if got != tuple(tensor.shape):
            raise InvalidArgument(f"elastic restore of '{name}': parameter '{key}' has shape {list(tensor.shape)} in "
                                  f"the model but {list(got) if got is not None else 'no tensor'} in the commit")
    extra = [k for k in saved if k not in model_state]
    if extra:
        raise InvalidArgument(f"elastic restore of '{name}': the commit has parameter '{extra[0]}' that the model "
                              "lacks (the commit was made by another model)")


class ModelStateHandler(StateHandler):
    def __init__(self, model):
        super().__init__(model)
        self.save()

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)

    def load_committed(self, saved, name):
        check_model_state(saved, self.value.state_dict(), name)
        self.value.load_state_dict(saved)
        self.save()


def _clear_pending(optimizer):
    """A failed step leaves DistributedOptimizer's launched allreduces behind: drop them (their results never came)."""
    if hasattr(optimizer, "_handles"):
        optimizer._handles.clear()
        optimizer._passes = {}
        optimizer._synchronized = False


class OptimizerStateHandler(StateHandler):
    """A torch optimizer; for a DistributedOptimizer its state_dict() carries "gradcomp" (this rank's compressor
    state), restored in memory with it, and its compressor spec and step counter are re-agreed in sync()."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.save()

    def restore(self):
        _clear_pending(self.value)
        self.value.load_state_dict(self._saved)

    def sync(self):
        opt = self.value
        _clear_pending(opt)
        broadcast_optimizer_state(opt, root_rank=0)
        if hasattr(opt, "_compressor"):
            opt._step_count_gc = agree_on_codec(opt._compressor.spec, opt._step_count_gc)

    def committed(self):
        return {k: v for k, v in self._saved.items() if k != "gradcomp"}

    def load_committed(self, saved, name):
        opt = self.value
        _clear_pending(opt)
        try:
            opt.load_state_dict(saved)  # without "gradcomp": the wrapped optimizer's state; residuals: membership
        except (ValueError, KeyError) as e:
            raise InvalidArgument(f"elastic restore of '{name}': the committed optimizer state does not fit this "
                                  f"optimizer ({e})") from None
        self.save()

    # -- the compressor state's owner (membership.py): kind, compressor, parameters, step --------------------------
    codec_kind = "optimizer"

    def codec_envelope(self):
        """This rank's committed compressor state (gradcomp._state envelope) or None (not a DistributedOptimizer)."""
        return self._saved.get("gradcomp")

    def codec_compressor(self):
        return getattr(self.value, "_compressor", None)

    def codec_params(self):
        """{parameter name: numel} of the parameters the compressor state may hold."""
        opt = self.value
        return {opt._names[id(p)]: p.numel() for g in opt.param_groups for p in g["params"]}

    def set_codec_step(self, step):
        self.value._step_count_gc = int(step)

    def grad_norm(self):
        total = 0.0
        for group in self.value.param_groups:
            for p in group["params"]:
                if p.grad is not None and not p.grad.is_sparse:
                    total += float(p.grad.detach().double().pow(2).sum())
        return math.sqrt(total)


def agree_on_codec(spec, step):
    """Collective: InvalidArgument on every rank unless all compress with `spec`; returns rank 0's `step` (the step
    counter keys random-k indices, QSGD/TernGrad draws and DGC's warm-up, so it must be the same on every rank)."""
    specs = allgather_object(spec, name="elastic.spec")
    if len(set(specs)) != 1:
        bad = next(r for r, s in enumerate(specs) if s != specs[0])
        raise InvalidArgument(f"elastic sync: rank {bad} compresses with '{specs[bad]}', rank 0 with '{specs[0]}' "
                              "(every rank must use the same spec)")
    return int(broadcast_object(int(step), 0, name="elastic.step"))


class HookStateHandler(StateHandler):
    """The DDP communication hook's HookState: its compressor state (residuals) per rank, its step counter agreed in
    sync(). DDP itself (the model) is tracked by the model's handler; its process group comes from the process."""

    codec_kind = "ddp_hook"

    def __init__(self, hook_state):
        super().__init__(hook_state)
        self.save()

    def save(self):
        self._saved = self.value.state_dict()  # a new envelope (bytes copied)

    def sync(self):
        self.value.step = agree_on_codec(self.value.compressor.spec, self.value.step)

    def committed(self):
        return {}

    def load_committed(self, saved, name):
        pass  # everything of the hook is per rank (membership.load_codecs) or agreed in sync()

    def codec_envelope(self):
        return self._saved

    def codec_compressor(self):
        return self.value.compressor

    def codec_params(self):
        return None  # the hook knows parameter names only once DDP has built its buckets

    def set_codec_step(self, step):
        self.value.step = int(step)

    def grad_norm(self):
        return 0.0  # the hook does not keep gradients


class LRSchedulerStateHandler(StateHandler):
    def __init__(self, scheduler):
        super().__init__(scheduler)
        self.save()

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0, name="elastic.scheduler"))

    def load_committed(self, saved, name):
        self.value.load_state_dict(saved)
        self.save()


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: a commit records the union of every rank's processed indices (a collective)."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self._saved = copy.deepcopy(sampler.state_dict())

    def save(self):
        state = copy.deepcopy(self.value.state_dict())
        if _ctx.size > 1:
            state["processed_indices"] = set().union(*allgather_object(self.value.processed_indices,
                                                                       name="elastic.sampler"))
        self._saved = state

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0, name="elastic.sampler"))

    def load_committed(self, saved, name):
        self.value.load_state_dict(saved)
        self._saved = copy.deepcopy(saved)


_handler_registry = [
    (HookState, HookStateHandler),
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (torch.optim.lr_scheduler._LRScheduler, LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    """Replaces the (type, handler class) list TorchState consults, first match wins (as Horovod's)."""
    global _handler_registry
    _handler_registry = registry


def split_handlers(values):
    """({name: handler} for the values a registered type handles, {name: value} for the rest)."""
    handlers, rest = {}, {}
    for name, value in values.items():
        cls = next((h for t, h in _handler_registry if isinstance(value, t)), None)
        if cls is not None:
            handlers[name] = cls(value)
        else:
            rest[name] = value
    return handlers, rest
