"""State belongs to its owner, for DDP hooks (issue 30): a generator G and a discriminator D of the same
architecture (so the same parameter names), each wrapped in DDP with its own gradcomp hook, in one process. For every
codec, G trained beside D must end bit-identical to the same G trained alone with its hook; likewise G with a hook
beside D with a DistributedOptimizer (torch backend). 2 gloo ranks (torch.multiprocessing)."""
import hashlib

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct
import helpers

STEPS = 4
CODECS = ["none", "fp16", "bf16", "qsgd:bits=4", "terngrad", "onebit", "topk:ratio=0.1", "randomk:ratio=0.1",
          "blocktopk:ratio=0.1,block=8", "dgc:ratio=0.05", "powersgd:rank=2"]


def _digest(model):
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _hooked(spec, seed):
    model = helpers.make_model(seed)
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets, so buckets of G and D interleave in the worker
    state, hook = gct.ddp_comm_hook(spec, model=model)
    ddp.register_comm_hook(state, hook)
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)


def _step(module, opt, step, rank, salt):
    opt.zero_grad()
    helpers.loss_of(module, helpers.make_batch(10 * step + salt, rank)).backward()
    opt.step()


def _worker(rank, world, url, specs, partner):
    helpers.init_gloo(rank, world, url)
    gct.init(backend="torch")
    failures = []
    for spec in specs:
        g_alone, ddp, opt = _hooked(spec, seed=1)
        for s in range(STEPS):
            _step(ddp, opt, s, rank, 1)
        alone = _digest(g_alone)
        helpers.release(ddp)
        g, ddp_g, opt_g = _hooked(spec, seed=1)
        if partner == "hook":
            d, ddp_d, opt_d = _hooked(spec, seed=1)  # same initial weights and names as G
        else:
            d = helpers.make_model(1)
            ddp_d = d
            opt_d = gct.DistributedOptimizer(torch.optim.SGD(d.parameters(), lr=0.1, momentum=0.9),
                                             named_parameters=d.named_parameters(), compression=spec)
        for s in range(STEPS):
            _step(ddp_d, opt_d, s, rank, 2)  # D's exchanges first, then G's
            _step(ddp_g, opt_g, s, rank, 1)
        if _digest(g) != alone:
            diff = max(float((a - b).abs().max()) for a, b in zip(g.parameters(), g_alone.parameters()))
            failures.append(f"{spec}: G beside D ({partner}) differs from G alone (max |diff| {diff:.3g})")
        helpers.release(*[m for m in (ddp_g, ddp_d) if isinstance(m, DDP)])
    assert not failures, f"rank {rank}: " + "; ".join(failures)


@pytest.mark.parametrize("partner", ["hook", "optimizer"])
def test_two_owners_keep_their_own_state(partner):
    mp.spawn(_worker, args=(2, helpers.rendezvous(), CODECS, partner), nprocs=2, join=True)
