"""CompressedAdam: Adam, AdamW or LAMB that compresses its momentum instead of the gradient (1-bit Adam, Tang et al.
2021; 0/1 Adam's variance refresh, Lu et al. 2022), for every gradcomp codec, through the same C++ collectives as
DistributedOptimizer (backends.py: "mpi", "torch", "runtime").

Error feedback cancels only for updates linear in what is compressed; Adam divides by sqrt(v) per coordinate, which
is not. So: a warm-up of exact steps (the gradient averaged with `exact_compression`, "none" by default) while v
settles; then v is frozen or refreshed on exact steps at growing intervals, and on every other step each rank updates
its local momentum m_r = beta1 * m + (1 - beta1) * g_r from the shared m, and m_r (or, compress="increment", its
own part (1 - beta1) * g_r) is what the codec compresses and averages, with its error feedback (the worker error)
and, on scatter-reduce-allgather, the owner's re-quantization error (the server error). The update m / (sqrt(v) + eps) is then linear in the compressed value and identical on
every rank. Coordinates whose v is (near) zero are left out of the compressed update (adam_math.guard_mask)."""
import sys

import torch

from .._compressors import Compressor, CompressionSpec, InvalidArgument, make_spec, owned_compressor
from .._gradcomp import Error, parse_spec
from . import adam_math as am
from . import compressed_adam_state
from . import grad_hooks
from .backends import _exchange_view, current as _backend
from .context import _ctx, _require_init, new_scope
from .errors import _internal_errors

_EXACT_CODECS = ("none", "fp16", "bf16", "qsgd")  # stateless with error feedback off (qsgd: unbiased)


class CompressedAdam(torch.optim.Optimizer):
    """Adam-type optimizer that owns its communication (use it instead of DistributedOptimizer; gradcomp.torch.init()
    first; every rank must call step() in lockstep).

    rule: "adamw" (decoupled weight decay, as torch.optim.AdamW), "adam" (L2 weight decay in the gradient, as
    torch.optim.Adam) or "lamb" (layer-wise trust ratio; frozen between exact steps, as 1-bit LAMB does).
    compression: the codec of the momentum (any C++ spec: "onebit", "topk:ratio=0.01", "qsgd:bits=4", "dgc",
    "powersgd:rank=16"; DGC runs with its momentum correction off).
    warmup: exact steps before compressing (an int), "auto" or an AutoWarmup (ends when v's relative change over a
    window is small; reported on stderr and in gradcomp_stats()).
    variance: "refresh" (exact steps at growing intervals, 0/1 Adam), "frozen", or a VarianceSchedule.
    exact_compression: the codec of the exact steps: "none", "fp16", "bf16" or "qsgd[:bits=N]" (without error
    feedback, so it holds no state).
    named_parameters: names for the codec's state (default "param.<group>.<index>", identical on every rank).
    compress: "momentum" (1-bit Adam: the rank's momentum m_r = beta1 * m + (1 - beta1) * g_r) or "increment" (its
    own part (1 - beta1) * g_r alone, beta1 * m being added after the average on every rank, as 0/1 Adam feeds the
    momentum: a sparsifier then spends no selection on the momentum's shared tail).
    precondition: compress it divided by sqrt(v_hat) + eps (same average, since v is shared; every coordinate on one
    scale, which suits codecs that share a scale or a selection across coordinates).
    guard: relative threshold of the tiny-variance guard (0: only sqrt(v_hat) <= eps is left out; None: off).
    exact_below: parameters of fewer values (biases, LayerNorm) take exact steps always (0, the default: none do).
    overlap: launch each exchange from the gradient's hook during backward (False: all of them in step()).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, rule="adamw",
                 compression="onebit", warmup="auto", variance="refresh", exact_compression="none",
                 named_parameters=None, compress="momentum", precondition=False, guard=1e-2, exact_below=0,
                 overlap=True, verbose=True):
        _require_init()
        if rule not in am.RULES:
            raise InvalidArgument(f"CompressedAdam: rule must be one of {', '.join(am.RULES)}, got {rule!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        for group in self.param_groups:
            _check_group(group)
        if compress not in ("momentum", "increment"):
            raise InvalidArgument(f"CompressedAdam: compress must be 'momentum' or 'increment', got {compress!r}")
        self.rule, self.precondition, self.guard, self.verbose = rule, bool(precondition), guard, bool(verbose)
        self.compress = compress
        self._compressor = _momentum_codec(compression)
        self._exact = _exact_codec(exact_compression)
        self._scope, self._exact_scope = new_scope("optimizer"), new_scope("optimizer")
        self._names = _parameter_names(self.param_groups, named_parameters)
        self._small = {id(p) for p in self._params() if p.numel() < int(exact_below)}  # always exact
        self._warmup = _warmup_policy(warmup)
        self._probe = am.AutoWarmup()  # v's change during a fixed warm-up, for the record
        self._schedule = variance if isinstance(variance, am.VarianceSchedule) else am.VarianceSchedule(variance)
        # The optimizer's progress (state_dict's "gradcomp_adam"): steps taken, v's updates, compressed steps, phase.
        self._step_count_gc = 0  # the name DistributedOptimizer and gradcomp.torch.elastic use
        self._v_updates = 0
        self._compressed_steps = 0
        self.switched_at = None  # the first compressed step, once the warm-up has ended
        self._snapshot = []  # v at the last auto warm-up check
        self._bytes = {"exact": [0, 0], "compressed": [0, 0]}  # [input bytes, payload bytes] per kind of step
        self._handles = {}
        self._denoms = {}  # id(p) -> sqrt(v_hat) + eps of the compressed steps (recomputed, never saved)
        self._keep = {}  # id(p) -> the guard mask as 0/1 of p's dtype, for parameters that have one (recomputed)
        self._groups_by_id = {}
        self._hook_handles, self._grad_accs = [], []
        for p in self._params():  # m and v exist from the start (broadcast_optimizer_state sends them as they are)
            self._state_of(p)
        if overlap:
            self._hook_handles, self._grad_accs = grad_hooks.register(self._params(), self._on_grad)

    # -- phases -------------------------------------------------------------------------------------------------------
    @property
    def phase(self):
        return "warmup" if self.switched_at is None else "compressed"

    def _exact_now(self):
        return self.switched_at is None or self._schedule.is_refresh(self._step_count_gc)

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def _group_of(self, p):
        group = self._groups_by_id.get(id(p))
        if group is None:  # a parameter group added after construction
            self._groups_by_id = {id(q): g for g in self.param_groups for q in g["params"]}
            group = self._groups_by_id[id(p)]
        return group

    # -- exchanges ----------------------------------------------------------------------------------------------------
    def _on_grad(self, p):
        if id(p) in self._handles:
            raise Error(f"gradcomp CompressedAdam: gradient of '{self._names[id(p)]}' computed twice before step(); "
                        "accumulate gradients with overlap=False")
        self._handles[id(p)] = self._launch(p, self._group_of(p), self._exact_now())

    def _launch(self, p, group, exact):
        """Starts p's exchange: the local gradient on an exact step, the local momentum otherwise. Returns
        (handle, tensor being averaged in place, stats)."""
        if p.grad is not None and p.grad.is_sparse:
            raise InvalidArgument(f"CompressedAdam: parameter '{self._names[id(p)]}' has a sparse gradient "
                                  "(not supported)")
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        state = self._state_of(p)
        stats = {}
        if exact or id(p) in self._small:  # p.grad itself when it can (averaged in place, as DistributedOptimizer)
            buf = grad if grad.is_contiguous() else grad.contiguous()
            codec, scope, step = self._exact, self._exact_scope, self._step_count_gc
        else:
            beta1 = group["betas"][0]
            g = am.local_gradient(self.rule, grad, p, group["weight_decay"])
            if self.compress == "momentum":  # m_r = beta1 * m + (1 - beta1) * g_r, in place: averaged into the new m
                buf = state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
            else:  # the rank's own part of m_r, (1 - beta1) * g_r; beta1 * m is added on every rank after the average
                buf = (g.mul_(1 - beta1) if g is grad and g.is_contiguous() else g.mul(1 - beta1))
            am.zero_masked_(buf, self._keep.get(id(p)))
            if self.precondition:
                buf.div_(self._denoms[id(p)])
            codec, scope, step = self._compressor, self._scope, self._compressed_steps
        handle = _backend().allreduce(codec, self._names[id(p)], _exchange_view(buf, codec), step, "average",
                                          scope=scope, stats=stats)
        return handle, buf, stats

    def _state_of(self, p):
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        return state

    def _synchronize(self):
        """Launches the exchanges whose hooks did not fire (all of them with overlap=False) and waits for every one;
        returns {id(p): averaged tensor} and whether the step is exact."""
        exact = self._exact_now()
        for p in self._params():
            if id(p) not in self._handles:
                self._handles[id(p)] = self._launch(p, self._group_of(p), exact)
        done = {}
        with _internal_errors():
            for key, (handle, buf, stats) in self._handles.items():
                handle.wait()
                done[key] = buf
                kind = "exact" if exact or key in self._small else "compressed"
                self._bytes[kind][0] += int(stats.get("input_bytes", 0))
                self._bytes[kind][1] += int(stats.get("payload_bytes", 0))
        self._handles.clear()
        return done, exact

    # -- the step -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        averaged, exact = self._synchronize()
        if exact:
            self._exact_step(averaged)
        else:
            self._compressed_step(averaged)
        self._step_count_gc += 1
        return loss

    def _exact_update(self, p, group, averaged, t, k):
        """Adam's step of p from its exactly averaged gradient: step t, v's k-th update."""
        beta1, beta2 = group["betas"]
        bc1, bc2 = am.bias_corrections(beta1, beta2, t, k)
        state = self._state_of(p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        g = am.local_gradient(self.rule, averaged.view_as(p), p, group["weight_decay"])
        am.update_moments(m, v, g, beta1, beta2)
        denom = am.denominator(v, bc2, group["eps"])
        state["trust"] = am.apply_update(self.rule, p, m, denom, group["lr"], group["weight_decay"], bc1)

    def _exact_step(self, averaged):
        t, k = self._step_count_gc + 1, self._v_updates + 1
        for group in self.param_groups:
            for p in group["params"]:
                self._exact_update(p, group, averaged[id(p)], t, t if id(p) in self._small else k)
        self._v_updates = k
        if self.switched_at is None:
            if not self._warmup_ends(t):
                return
            self.switched_at = t
            self._schedule.start(t)
            self._snapshot = []
            self._report_switch()
        else:
            self._schedule.refreshed(self._step_count_gc)
        self._prepare_compressed()

    def _compressed_step(self, averaged):
        t = self._step_count_gc + 1
        for group in self.param_groups:
            beta1, _ = group["betas"]
            bc1 = 1.0 - beta1 ** t
            for p in group["params"]:
                if id(p) in self._small:
                    self._exact_update(p, group, averaged[id(p)], t, t)
                    continue
                state = self.state[p]
                m, denom, avg = state["exp_avg"], self._denoms[id(p)], averaged[id(p)].view_as(p)
                if self.precondition:
                    avg.mul_(denom)
                if self.compress == "increment":
                    m.mul_(beta1).add_(avg)
                am.zero_masked_(m, self._keep.get(id(p)))
                am.apply_update(self.rule, p, m, denom, group["lr"], group["weight_decay"], bc1,
                                trust=state.get("trust"))
        self._compressed_steps += 1

    def _prepare_compressed(self):
        """After an exact step that compressed steps follow: each parameter's denominator and guard mask from v."""
        for group in self.param_groups:
            _, bc2 = am.bias_corrections(*group["betas"], 1, self._v_updates)
            for p in group["params"]:
                if id(p) in self._small:
                    continue
                state = self.state[p]
                self._denoms[id(p)] = am.denominator(state["exp_avg_sq"], bc2, group["eps"])
                mask = None if self.guard is None else am.guard_mask(state["exp_avg_sq"], bc2, group["eps"],
                                                                     self.guard)
                if mask is None:
                    state.pop("mask", None)
                    self._keep.pop(id(p), None)
                else:
                    state["mask"] = mask
                    self._keep[id(p)] = mask.to(state["exp_avg"].dtype)
                    am.zero_masked_(state["exp_avg"], self._keep[id(p)])

    def _warmup_ends(self, steps_done):
        """A fixed warm-up still records v's relative change (gradcomp_stats()["variance_change"], with the auto
        warm-up's default window) to show where "auto" would have ended it."""
        variances = [self.state[p]["exp_avg_sq"] for p in self._params()]
        ends = self._warmup.check(steps_done, variances, self._snapshot) if isinstance(self._warmup, am.AutoWarmup) \
            else self._probe.check(steps_done, variances, self._snapshot) and False
        return ends or (isinstance(self._warmup, int) and steps_done >= self._warmup)

    def _auto(self):
        return self._warmup if isinstance(self._warmup, am.AutoWarmup) else self._probe

    def _report_switch(self):
        if not self.verbose or _ctx.rank != 0:
            return
        why = f"warmup={self._warmup}"
        if isinstance(self._warmup, am.AutoWarmup) and self._warmup.history:
            why = f"v changed {self._warmup.history[-1][1]:.3f} over the last {self._warmup.window} steps"
        print(f"gradcomp CompressedAdam: warm-up over after {self.switched_at} exact steps ({why}); compressing the "
              f"momentum with '{self._compressor.spec}', variance {self._schedule.variance}", file=sys.stderr,
              flush=True)

    # -- the rest of torch.optim.Optimizer -----------------------------------------------------------------------------
    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise Error("gradcomp CompressedAdam: zero_grad() called between backward() and step(); call step() "
                        "first")
        return super().zero_grad(*args, **kwargs)

    def gradcomp_stats(self):
        """Where the optimizer stands: phase, switched_at, steps, exact and compressed steps, and the bytes this rank
        handed to the collectives and the payload bytes they made of them (the 'mpi' and 'torch' backends report
        them), per kind of step and end to end (ratio = input / payload, warm-up and refreshes counted)."""
        (xi, xp), (ci, cp) = self._bytes["exact"], self._bytes["compressed"]
        return {"phase": self.phase, "switched_at": self.switched_at, "steps": self._step_count_gc,
                "exact_steps": self._v_updates, "compressed_steps": self._compressed_steps,
                "input_bytes": xi + ci, "payload_bytes": xp + cp, "exact_bytes": (xi, xp),
                "compressed_bytes": (ci, cp), "ratio": (xi + ci) / (xp + cp) if xp + cp else float("nan"),
                "variance_change": list(self._auto().history)}

    def state_dict(self):
        """torch's state (m, v per parameter) plus "gradcomp" (this rank's codec state) and "gradcomp_adam" (the
        phase and counters); see compressed_adam_state. Save one file per rank."""
        return compressed_adam_state.save(self, super().state_dict(), _ctx)

    def load_state_dict(self, state_dict):
        """Restores this rank's own state_dict(); another rank's or world size's is refused, a failed load changes
        nothing."""
        compressed_adam_state.load(self, state_dict, _ctx, super().load_state_dict)

    def _remove_hooks(self):
        for h in self._hook_handles:
            h.remove()
        self._hook_handles, self._grad_accs = [], []


def _check_group(group):
    beta1, beta2 = group["betas"]
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise InvalidArgument(f"CompressedAdam: betas must lie in [0, 1), got {group['betas']}")
    if not group["eps"] > 0 or group["lr"] < 0 or group["weight_decay"] < 0:
        raise InvalidArgument(f"CompressedAdam: needs eps > 0, lr >= 0, weight_decay >= 0 (got eps={group['eps']}, "
                              f"lr={group['lr']}, weight_decay={group['weight_decay']})")


def _momentum_codec(compression):
    spec = compression.spec if isinstance(compression, (Compressor, CompressionSpec)) else compression
    if not isinstance(spec, str):
        raise InvalidArgument("CompressedAdam: compression must be a gradcomp spec or Compressor (a C++ codec), got "
                              f"{compression!r}")
    try:
        codec = owned_compressor(am.momentum_spec(spec))
    except ValueError as e:
        raise InvalidArgument(f"CompressedAdam: {e}") from None
    if codec.is_python:
        raise InvalidArgument(f"CompressedAdam: compression '{spec}' is a Python codec; the momentum needs a C++ "
                              "codec (its error feedback lives in the C++ collectives)")
    return codec


def _exact_codec(spec):
    name = parse_spec(getattr(spec, "spec", spec))[0]
    if name not in _EXACT_CODECS:
        raise InvalidArgument(f"CompressedAdam: exact_compression must be one of {', '.join(_EXACT_CODECS)}, got "
                              f"{spec!r}")
    return owned_compressor(name if name == "none" else make_spec(getattr(spec, "spec", spec), ef="off"))


def _warmup_policy(warmup):
    if warmup == "auto":
        return am.AutoWarmup()
    if isinstance(warmup, am.AutoWarmup):
        return warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise InvalidArgument(f"CompressedAdam: warmup must be a number of steps >= 1, 'auto' or an AutoWarmup, got "
                              f"{warmup!r}")
    return warmup


def _parameter_names(groups, named_parameters):
    params = [p for g in groups for p in g["params"]]
    if named_parameters is None:
        return {id(p): f"param.{gi}.{pi}" for gi, g in enumerate(groups) for pi, p in enumerate(g["params"])}
    named = list(named_parameters)
    names = {id(p): n for n, p in named}
    if len(set(n for n, _ in named)) != len(named):
        raise InvalidArgument("CompressedAdam: named_parameters has duplicate names")
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise InvalidArgument(f"CompressedAdam: {len(missing)} optimizer parameters are missing from named_parameters")
    return names


def from_torch_optimizer(optimizer, named_parameters, compression, **options):
    """DistributedOptimizer(optimizer, exchange="momentum"): a CompressedAdam over `optimizer`'s parameter groups
    (the same group dicts, so a learning-rate scheduler made for `optimizer` drives it) with its hyperparameters and
    rule (torch.optim.AdamW -> "adamw", torch.optim.Adam -> "adam"), taking over its state (m, v and the step count
    of steps already taken, all exact); `options` are CompressedAdam's keywords."""
    rule = {torch.optim.AdamW: "adamw", torch.optim.Adam: "adam"}.get(type(optimizer))
    if rule is None:
        raise InvalidArgument("DistributedOptimizer(exchange='momentum') wraps torch.optim.Adam or torch.optim.AdamW, "
                              f"got {type(optimizer).__name__} (LAMB: gradcomp.torch.CompressedAdam(rule='lamb'))")
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize", "capturable", "differentiable", "fused"):
            if group.get(flag):
                raise InvalidArgument(f"DistributedOptimizer(exchange='momentum'): {flag}=True is not supported")
    steps = {int(st["step"]) for st in optimizer.state.values() if "step" in st}
    if len(steps) > 1:
        raise InvalidArgument(f"DistributedOptimizer(exchange='momentum'): the parameters have taken different numbers "
                              f"of steps ({sorted(steps)}); every parameter must have the same")
    d = optimizer.defaults
    opt = CompressedAdam(optimizer.param_groups, lr=d["lr"], betas=d["betas"], eps=d["eps"],
                         weight_decay=d["weight_decay"], rule=rule, compression=compression,
                         named_parameters=named_parameters, **options)
    for p, st in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                opt.state[p][key].copy_(st[key])
    if steps:
        opt._step_count_gc = opt._v_updates = steps.pop()
    return opt
