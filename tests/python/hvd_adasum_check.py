"""Adasum on the C++ communicator (GRADCOMP_BACKEND mpi or runtime, under mpirun): adasum_allreduce_ of float32,
float64, float16 and bfloat16 tensors of several sizes, and DistributedOptimizer(op=Adasum) (start + the Adasum of the
ranks' local SGD deltas), against adasum_truth.py (the paper's definition, written in the tests) on non-orthogonal
inputs of unequal norms that every rank regenerates from the same seeds. On a non-power-of-two count both raise
NotImplementedError on every rank. Exits non-zero on a mismatch.

    mpirun -np 4 python tests/python/hvd_adasum_check.py
"""
import sys

import torch

import adasum_truth
import gradcomp.torch as hvd
from gradcomp.torch import adasum

hvd.init()
torch.set_num_threads(1)
world, rank = hvd.size(), hvd.rank()
failures = []


def check(got, tensors, dtype, what):
    try:
        adasum_truth.check(got, tensors, dtype, what)
    except AssertionError as e:
        failures.append(str(e))


def raises_not_implemented(fn, what):
    try:
        fn()
        failures.append(f"{what}: no NotImplementedError on {world} ranks")
    except NotImplementedError as e:
        if f"{world} ranks" not in str(e) and "power-of-two" not in str(e):
            failures.append(f"{what}: message does not name the count: {e}")


if world & (world - 1):
    raises_not_implemented(lambda: adasum.adasum_allreduce_(torch.ones(5)), "adasum_allreduce_")
    raises_not_implemented(lambda: hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
                                                            op=hvd.Adasum), "DistributedOptimizer(op=Adasum)")
else:
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for numel in (1, 5, 64, 1000, 4097):
            xs = adasum_truth.inputs(world, numel, seed=numel, dtype=dtype)
            t = xs[rank].clone()
            adasum.adasum_allreduce_(t)
            check(t, xs, dtype, f"adasum {dtype} numel {numel}")

    model = torch.nn.Linear(6, 3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    start = [p.detach().clone() for p in model.parameters()]

    def batch(r):  # rank r's batch, scaled so the ranks' deltas have unequal norms
        g = torch.Generator().manual_seed(100 + r)
        return adasum_truth.SCALES[r % len(adasum_truth.SCALES)] * torch.randn(8, 6, generator=g)

    deltas = []
    for r in range(world):
        m = torch.nn.Linear(6, 3)
        m.load_state_dict(model.state_dict())
        m(batch(r)).pow(2).sum().backward()
        deltas.append([-0.1 * p.grad for p in m.parameters()])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   op=hvd.Adasum)
    opt.zero_grad()
    model(batch(rank)).pow(2).sum().backward()
    opt.step()
    for i, p in enumerate(model.parameters()):
        # the delta the optimizer applied, exact in float64 up to one float32 rounding of start + delta
        want = adasum_truth.adasum([d[i] for d in deltas])
        allowed = 1e-5 * float(want.abs().max()) + 2.0 ** -23 * float((start[i].double() + want).abs().max())
        err = float((p.detach().double() - start[i].double() - want).abs().max())
        if err > allowed:
            failures.append(f"Adasum optimizer param {i}: error {err:.3g} > {allowed:.3g}")

if failures:
    print(f"rank {rank} ({hvd.backend()}, {world} ranks): " + "; ".join(failures), file=sys.stderr)
    sys.exit(1)
if rank == 0:
    print(f"adasum check passed ({hvd.backend()}, {world} ranks)")
