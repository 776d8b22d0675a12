"""NaN/Inf in one rank's gradient at one step, inside a DDP bucket, through the hook (2 gloo ranks): the hook hands
the bucket to compressed_allreduce with one segment per parameter, so the non-finite policy applies to that parameter
only. skip without error feedback is exactly a zero gradient for that parameter (every step, every parameter, bit for
bit); skip with error feedback leaves the steps before equal to a clean run and everything finite; pass keeps later
steps finite; raise names the parameter and the rank. (The runtime's counterpart: tests/runtime/runtime_nonfinite_test.cc.)
"""
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradcomp
import gradcomp.torch as gct
import helpers

WORLD, STEPS, BAD_STEP, BAD_RANK, BAD = 2, 5, 2, 1, 1
SIZES = (1500, 700, 2600)  # param0, param1, param2: one bucket; param1 gets the NaN


def _gradient(rank, step, t):
    return torch.randn(SIZES[t], generator=torch.Generator().manual_seed(1000 * rank + 10 * step + t))


def _train(spec, dirt, rank):
    """Every step's aggregated bucket (identical on both ranks); at BAD_STEP rank BAD_RANK's param1 is dirtied
    ("nan": a NaN and an Inf; "zeros") or not (None)."""
    state, hook = gct.ddp_comm_hook(spec)
    params = [torch.zeros(n) for n in SIZES]
    results = []
    for step in range(STEPS):
        grads = [_gradient(rank, step, t) for t in range(len(SIZES))]
        if step == BAD_STEP and rank == BAD_RANK and dirt is not None:
            if dirt == "zeros":
                grads[BAD].zero_()
            else:
                grads[BAD][17] = math.nan
                grads[BAD][400] = math.inf
        out = hook(state, helpers.FakeBucket(torch.cat(grads), params)).wait()
        results.append(out.clone())
    return results


def _policy(spec, policy):
    return spec + ("," if ":" in spec else ":") + f"nonfinite={policy}"


def _available(specs):
    names = {c["name"] for c in gradcomp.list_compressors()}
    return [s for s in specs if s.split(":")[0] in names]


def _worker(rank, url):
    helpers.init_gloo(rank, WORLD, url)
    # skip without error feedback == a zero gradient there, bit for bit (top-k's neighbours compete with it too).
    for spec in _available(["none", "topk:ratio=0.1,ef=off", "qsgd:bits=4,ef=off", "fp16:ef=off"]):
        spec = _policy(spec, "skip")
        skipped, zeros = _train(spec, "nan", rank), _train(spec, "zeros", rank)
        for step in range(STEPS):
            assert torch.equal(skipped[step], zeros[step]), f"{spec}: step {step} differs from a zero gradient"
    # skip with error feedback: the steps before equal a clean run; nothing non-finite at any step.
    for spec in _available(["topk:ratio=0.05", "qsgd:bits=4", "onebit", "dgc:ratio=0.01"]):
        spec = _policy(spec, "skip")
        skipped, clean = _train(spec, "nan", rank), _train(spec, None, rank)
        for step in range(BAD_STEP):
            assert torch.equal(skipped[step], clean[step]), f"{spec}: step {step} differs from the clean run"
        for step in range(STEPS):
            assert torch.isfinite(skipped[step]).all(), f"{spec}: non-finite result at step {step}"
    # pass: the bad step carries the NaN/Inf, later steps are finite (no residual kept it).
    for spec in _available(["topk:ratio=0.05", "qsgd:bits=4", "dgc:ratio=0.01"]):
        spec = _policy(spec, "pass")
        run = _train(spec, "nan", rank)
        for step in range(BAD_STEP + 1, STEPS):
            assert torch.isfinite(run[step]).all(), f"{spec}: non-finite result at step {step}"
    # raise: each rank's error names its own parameter and rank (both ranks dirty, so neither waits for the other).
    state, hook = gct.ddp_comm_hook("topk:ratio=0.05,nonfinite=raise")
    params = [torch.zeros(n) for n in SIZES]
    grads = [_gradient(rank, 0, t) for t in range(len(SIZES))]
    bad = 0 if rank == 0 else 2
    grads[bad][5] = math.nan
    with pytest.raises(gradcomp.InvalidArgument) as err:
        hook(state, helpers.FakeBucket(torch.cat(grads), params)).wait()
    assert f"param{bad}" in str(err.value) and f"rank {rank}" in str(err.value), str(err.value)
    dist.barrier()
    dist.destroy_process_group()


def test_hook_nonfinite_policies_2_ranks():
    mp.spawn(_worker, args=(helpers.rendezvous(),), nprocs=WORLD, join=True)
