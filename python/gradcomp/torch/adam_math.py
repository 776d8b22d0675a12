"""The arithmetic of CompressedAdam (compressed_adam.py), free of communication: the update rules (Adam, AdamW,
LAMB), the guard that keeps coordinates with a (near-)zero variance out of the compressed update, the variance refresh
schedule (0/1 Adam's exponentially growing intervals) and the automatic end of the warm-up.

The exact step (warm-up, variance refresh) computes what torch.optim.Adam / AdamW compute, op for op, so a
CompressedAdam that never leaves its warm-up ends bit-identical to DistributedOptimizer(torch.optim.AdamW, 'none')."""
import math

RULES = ("adam", "adamw", "lamb")


def bias_corrections(beta1, beta2, step, v_updates):
    """(1 - beta1^step, 1 - beta2^v_updates): m has been updated `step` times, v only on the exact steps."""
    return 1.0 - beta1 ** step, 1.0 - beta2 ** max(1, v_updates)


def local_gradient(rule, grad, p, weight_decay):
    """The gradient the moments see: Adam's L2 weight decay adds weight_decay * p (identical on every rank, since the
    parameters are); AdamW and LAMB decay the weights apart from the moments."""
    if rule == "adam" and weight_decay != 0.0:
        return grad.add(p, alpha=weight_decay)
    return grad


def update_moments(m, v, g, beta1, beta2):
    """Exact step: both moments from the averaged gradient `g`, in place (the installed torch's order of operations:
    m by lerp_ on torch 2, by mul_ and add_ on 1.13; the two differ in the last bit from the second step on)."""
    if torch_adam_uses_lerp():
        m.lerp_(g, 1 - beta1)
    else:
        m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)


_uses_lerp = None


def torch_adam_uses_lerp():
    """Whether the installed torch.optim.Adam updates its first moment with lerp_ (torch 2) rather than mul_ and add_
    (torch 1.13). Found once, by two steps of torch's own Adam on a small tensor, so no version number is assumed."""
    global _uses_lerp
    if _uses_lerp is None:
        import torch
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(64, generator=gen) for _ in range(2)]
        p = torch.zeros(64, requires_grad=True)
        opt = torch.optim.Adam([p], lr=0.1, betas=(0.9, 0.95))
        for g in grads:
            p.grad = g.clone()
            opt.step()
        lerp = torch.zeros(64)
        for g in grads:
            lerp.lerp_(g, 1 - 0.9)
        _uses_lerp = bool(torch.equal(opt.state[p]["exp_avg"], lerp))
    return _uses_lerp


def denominator(v, bc2, eps):
    """sqrt(v / bc2) + eps, as torch's Adam computes it."""
    return (v.sqrt() / math.sqrt(bc2)).add_(eps)


def guard_mask(v, bc2, eps, relative):
    """The coordinates kept in the compressed update (a bool tensor), or None when all are. A coordinate whose
    sqrt(v_hat) is at most eps, or below `relative` times its tensor's mean sqrt(v_hat), is left out: its gradient is
    (near) zero (a bias the loss ignores, an embedding row never looked up), so exact Adam barely moves it, but a
    compressed momentum hands it a share of its neighbours' magnitude (a sign codec: the bucket's mean), which
    divided by its tiny sqrt(v) would throw it far away."""
    root = v.sqrt() / math.sqrt(bc2)
    keep = root > eps
    if relative > 0 and root.numel() > 0:
        keep &= root >= relative * float(root.mean())
    return None if bool(keep.all()) else keep


def apply_update(rule, p, m, denom, lr, weight_decay, bc1, trust=None):
    """One step of `rule` on parameter `p` from momentum `m` (coordinates left out by the guard are zero in m) and the
    denominator sqrt(v_hat) + eps. Returns LAMB's trust ratio (the one used, or a new one when `trust` is None),
    None for the other rules."""
    if rule == "adamw":
        p.mul_(1 - lr * weight_decay)
    if rule != "lamb":
        p.addcdiv_(m, denom, value=-lr / bc1)
        return None
    r = (m / bc1).div_(denom)
    if weight_decay != 0.0:
        r.add_(p, alpha=weight_decay)
    if trust is None:
        trust = lamb_trust(p, r)
    p.add_(r, alpha=-lr * trust)
    return trust


def lamb_trust(p, r):
    """LAMB's layer-wise trust ratio ||p|| / ||r|| (1 when either norm is zero)."""
    wn, rn = float(p.norm()), float(r.norm())
    return wn / rn if wn > 0 and rn > 0 else 1.0


class VarianceSchedule:
    """Which steps are exact (both moments from the exactly averaged gradient) after the warm-up. "frozen": none, v
    keeps its warm-up value. "refresh" (0/1 Adam, Lu et al. 2022): an exact step after `interval` compressed ones,
    the interval starting at 1 and doubling after every `kappa` refreshes, up to `max_interval` (None: no bound).
    The state is plain integers (state_dict)."""

    def __init__(self, variance, kappa=16, max_interval=None):
        if variance not in ("frozen", "refresh"):
            raise ValueError(f"variance must be 'frozen' or 'refresh', got {variance!r}")
        if int(kappa) < 1:
            raise ValueError(f"refresh_kappa must be >= 1, got {kappa}")
        if max_interval is not None and int(max_interval) < 1:
            raise ValueError(f"refresh_max_interval must be >= 1 or None, got {max_interval}")
        self.variance, self.kappa = variance, int(kappa)
        self.max_interval = None if max_interval is None else int(max_interval)
        self.interval, self.count, self.next = 1, 0, None

    def start(self, first_compressed_step):
        """The warm-up ended: `first_compressed_step` is the first compressed step."""
        self.interval, self.count = 1, 0
        self.next = first_compressed_step + self.interval if self.variance == "refresh" else None

    def is_refresh(self, step):
        return self.next is not None and step == self.next

    def refreshed(self, step):
        """After the exact step `step`: when the next one is."""
        self.count += 1
        if self.count == self.kappa:
            self.count = 0
            self.interval *= 2
            if self.max_interval is not None:
                self.interval = min(self.interval, self.max_interval)
        self.next = step + self.interval + 1

    def state(self):
        return {"interval": self.interval, "count": self.count, "next": self.next}

    def load(self, state):
        self.interval, self.count, self.next = int(state["interval"]), int(state["count"]), state["next"]


class AutoWarmup:
    """warmup="auto": every `window` exact steps, the relative change of v since the previous check,
    sum|v - v_before| / sum|v| over every parameter, is compared with `tol`; the warm-up ends at the first check at
    or after `min_steps` where it is at most `tol`, and at `max_steps` at the latest (None: no bound). The
    snapshot of v exists only during the warm-up."""

    def __init__(self, window=50, tol=0.2, min_steps=0, max_steps=None):
        if int(window) < 1 or not tol > 0:
            raise ValueError(f"auto warm-up needs window >= 1 and tol > 0, got window={window}, tol={tol}")
        self.window, self.tol = int(window), float(tol)
        self.min_steps, self.max_steps = int(min_steps), None if max_steps is None else int(max_steps)
        self.history = []  # (step, relative change) of every check

    def check(self, steps_done, variances, snapshot):
        """After `steps_done` exact steps: True when the warm-up ends now. `snapshot` (list of tensors, or None on
        the first call) is replaced in place by a copy of `variances` at every check."""
        if self.max_steps is not None and steps_done >= self.max_steps:
            return True
        if steps_done % self.window:
            return False
        change = None
        if snapshot:
            diff = sum(float((v - s).abs().sum()) for v, s in zip(variances, snapshot))
            total = sum(float(v.abs().sum()) for v in variances)
            change = diff / total if total > 0 else 0.0
            self.history.append((steps_done, change))
        snapshot[:] = [v.detach().clone() for v in variances]
        return change is not None and steps_done >= self.min_steps and change <= self.tol


def momentum_spec(spec):
    """The codec spec for compressing a momentum: DGC's momentum correction is switched off (the optimizer owns the
    momentum), unless the spec sets it, which is refused. Other specs are returned unchanged."""
    from .._gradcomp import parse_spec
    name, pairs = parse_spec(spec)
    if name != "dgc":
        return spec
    params = dict(pairs)
    if float(params.get("momentum", "0")) != 0.0:
        raise ValueError(f"compression '{spec}': DGC's momentum correction must be off when the optimizer compresses "
                         "its own momentum (momentum=0, the default here)")
    params["momentum"] = "0"
    return name + ":" + ",".join(f"{k}={v}" for k, v in params.items())


def zero_masked_(tensor, keep):
    """tensor *= keep in place, `keep` being a guard mask as 0/1 of tensor's dtype (nothing when keep is None): the
    bits of tensor.mul_(bool_mask) at a tenth of its cost (torch converts a bool operand per element: 46 against
    4.5 ms for 25M floats on one core)."""
    if keep is not None:
        tensor.mul_(keep)
    return tensor

