"""The checks of gradcomp.torch.CompressedAdam, run by every rank after gradcomp.torch.init() on any backend (the
pytest file spawns gloo ranks for the "torch" backend; compressed_adam_check.py runs them under mpirun on "mpi" and
"runtime"). Each raises AssertionError naming the rank, the step and the parameter."""
import copy
import hashlib
import io

import numpy as np
import torch

import gradcomp.torch as hvd
import helpers
from onebit_adam_reference import OneBitAdam

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def _model():
    torch.manual_seed(7)
    # 32*64 = 2048 weights: on 2 and 4 ranks every piece holds several 512-value buckets.
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def _batches(step, world):
    return [helpers.make_batch(step, r) for r in range(world)]


def _grads(model, batch):
    model.zero_grad()
    helpers.loss_of(model, batch).backward()
    return {n: p.grad.detach().clone().view(-1).numpy() for n, p in model.named_parameters()}


def _digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def check_identical_on_every_rank(model, step):
    digests = hvd.allgather_object(_digest(model))
    assert len(set(digests)) == 1, f"rank {hvd.rank()} step {step}: parameters differ across ranks: {digests}"


def check_against_onebit_adam_reference(warmup=3, steps=9, exact_below=0, compress="momentum"):
    """CompressedAdam(onebit, frozen v) equals the NumPy 1-bit Adam step at every step (warm-up, then worker and
    server errors; tensors of fewer than exact_below values exact throughout; compress="increment": 0/1 Adam's
    feed), and every rank holds the same parameters after every step."""
    rank, world = hvd.rank(), hvd.size()
    model = _model()
    opt = hvd.CompressedAdam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, compression="onebit",
                             warmup=warmup, variance="frozen", named_parameters=model.named_parameters(),
                             exact_below=exact_below, compress=compress, verbose=False)
    ref = OneBitAdam({n: p.detach().view(-1).numpy() for n, p in model.named_parameters()}, world, LR, BETAS, EPS,
                     WD, warmup, exact=[n for n, p in model.named_parameters() if p.numel() < exact_below],
                     mode=compress)
    shadow = copy.deepcopy(model)
    for step in range(steps):
        batches = _batches(step, world)
        grads = []
        for r in range(world):  # every rank's gradient at the shared parameters (the reference needs them all)
            shadow.load_state_dict(model.state_dict())
            grads.append(_grads(shadow, batches[r]))
        ref.step(grads)
        opt.zero_grad()
        helpers.loss_of(model, batches[rank]).backward()
        opt.step()
        assert opt.phase == ("warmup" if step + 1 < warmup else "compressed"), f"step {step}: phase {opt.phase}"
        for n, p in model.named_parameters():
            got, want = p.detach().view(-1).numpy(), ref.p[n]
            err = float(np.abs(got - want).max())
            assert err <= 1e-5 * LR + 1e-6 * float(np.abs(want).max()), \
                f"rank {rank} step {step} ({opt.phase}) param {n}: differs from the 1-bit Adam reference by {err:.3g}"
        check_identical_on_every_rank(model, step)
    stats = opt.gradcomp_stats()
    assert stats["exact_steps"] == warmup and stats["compressed_steps"] == steps - warmup, stats
    opt._remove_hooks()


def _train(model, opt, first, steps):
    for step in range(first, first + steps):
        opt.zero_grad()
        helpers.loss_of(model, helpers.make_batch(step, hvd.rank())).backward()
        opt.step()
        check_identical_on_every_rank(model, step)


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def check_state_round_trip(spec, rule="adamw", variance="refresh", precondition=False, compress="momentum"):
    """Saved after the warm-up and loaded into a fresh model and optimizer, the run ends bit-identical to the
    uninterrupted one (m, v, the codec's worker and server errors, phase and schedule all restored)."""
    def make():
        model = _model()
        opt = hvd.CompressedAdam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, rule=rule,
                                 compression=spec, warmup=3, variance=variance, precondition=precondition,
                                 named_parameters=model.named_parameters(), exact_below=100, compress=compress,
                                 verbose=False)
        return model, opt

    model, opt = make()
    _train(model, opt, 0, 6)
    saved = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    _train(model, opt, 6, 5)
    model2, opt2 = make()
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    assert opt2.phase == "compressed" and opt2._step_count_gc == 6
    _train(model2, opt2, 6, 5)
    for (n, a), b in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(a, b), f"rank {hvd.rank()} {spec}: '{n}' differs after resuming"
    opt._remove_hooks()
    opt2._remove_hooks()
    return saved["opt"]


class TinyVarianceModel(torch.nn.Module):
    """An embedding whose row 0 is never looked up, and a bias vector whose last element the loss ignores exactly: it
    is added to every logit of a softmax (the attention key bias's situation in a transformer's qkv bias), so its
    gradient is zero up to rounding while the other elements of its tensor (and of its codec bucket) learn."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 6, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(7))  # [0:6] the logits' bias, [6] the ignored "key bias"

    def forward(self, tokens):
        logits = self.head(self.embed(tokens).mean(1)) + self.bias[:6] + self.bias[6]
        return torch.log_softmax(logits, dim=-1)


def check_tiny_variance_guard(guard=1e-2, steps=12, warmup=4):
    """With the guard, the unused embedding row and the ignored bias stay finite and exactly where the warm-up left
    them (weight decay 0) through compressed onebit steps; returns how far they moved (the test also runs guard=None
    to show that without it they are thrown away)."""
    model = TinyVarianceModel()
    opt = hvd.CompressedAdam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, compression="onebit",
                             warmup=warmup, variance="frozen", guard=guard, named_parameters=model.named_parameters(),
                             exact_below=0, verbose=False)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    after_warmup = None
    for step in range(steps):
        tokens = torch.randint(1, 16, (8, 5), generator=g)  # row 0 never appears
        target = torch.randint(0, 6, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.nll_loss(model(tokens), target).backward()
        opt.step()
        if step + 1 == warmup:
            after_warmup = (model.embed.weight[0].detach().clone(), model.bias[6:].detach().clone())
        check_identical_on_every_rank(model, step)
    row, bias = model.embed.weight[0].detach(), model.bias[6:].detach()
    assert torch.isfinite(row).all() and torch.isfinite(bias).all()
    moved = max(float((row - after_warmup[0]).abs().max()), float((bias - after_warmup[1]).abs().max()))
    opt._remove_hooks()
    return moved
