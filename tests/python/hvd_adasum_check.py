"""Adasum on the C++ communicator (GRADCOMP_BACKEND mpi or runtime, under mpirun): adasum_allreduce_ of float32,
float64 and float16 tensors of several sizes against the recursive pairwise formula computed here from every rank's
input (each rank regenerates all inputs from the same seeds); DistributedOptimizer(op=Adasum) against start + the
Adasum of the ranks' local SGD deltas. Exits non-zero on a mismatch.

    mpirun -np 4 python tests/python/hvd_adasum_check.py
"""
import sys

import torch

import gradcomp.torch as hvd
from gradcomp.torch import adasum

hvd.init()
torch.set_num_threads(1)
world, rank = hvd.size(), hvd.rank()
failures = []


def check(got, want, tol, what):
    err = float((got.double() - want.double()).abs().max()) / (float(want.double().abs().max()) + 1e-12)
    if err > tol:
        failures.append(f"{what}: relative error {err:.3g}")


for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12), (torch.float16, 2e-3)):
    for numel in (1, 5, 64, 1000, 4097):
        g = torch.Generator().manual_seed(numel)
        xs = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(world)]
        xs = [(x + 0.3 * xs[0]).to(dtype) for x in xs]
        t = xs[rank].clone()
        adasum.adasum_allreduce_(t)
        check(t, adasum.adasum_reference(xs), tol, f"adasum {dtype} numel {numel}")

model = torch.nn.Linear(6, 3)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
start = [p.detach().clone() for p in model.parameters()]
deltas = []
for r in range(world):
    m = torch.nn.Linear(6, 3)
    m.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(100 + r)
    m(torch.randn(8, 6, generator=g)).pow(2).sum().backward()
    deltas.append([-0.1 * p.grad for p in m.parameters()])
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=hvd.Adasum)
g = torch.Generator().manual_seed(100 + rank)
opt.zero_grad()
model(torch.randn(8, 6, generator=g)).pow(2).sum().backward()
opt.step()
for i, p in enumerate(model.parameters()):
    check(p.detach(), start[i] + adasum.adasum_reference([d[i] for d in deltas]), 1e-5, f"Adasum optimizer param {i}")

if failures:
    print(f"rank {rank} ({hvd.backend()}, {world} ranks): " + "; ".join(failures), file=sys.stderr)
    sys.exit(1)
if rank == 0:
    print(f"adasum check passed ({hvd.backend()}, {world} ranks)")
