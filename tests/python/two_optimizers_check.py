"""A GAN-shaped script: a generator G and a discriminator D of the same architecture (so the same parameter names),
each with its own DistributedOptimizer, in one process. For every stateful codec, G trained beside D must end
bit-identical to the same G trained alone, on the backend GRADCOMP_BACKEND names (runtime, mpi, torch). Run under
mpirun; exits non-zero on any difference.

    mpirun -np 2 python tests/python/two_optimizers_check.py [--digests FILE] [--codecs "a;b"]

--digests FILE: rank 0 writes {codec: sha256 of G's parameters after the steps} as JSON (the reproducibility test
compares them across runs, fusion thresholds and cycle times).
"""
import argparse
import hashlib
import json
import sys

import torch

import gradcomp.torch as hvd

CODECS = ["none", "fp16", "bf16", "qsgd:bits=4", "terngrad", "onebit", "topk:ratio=0.1", "randomk:ratio=0.1",
          "blocktopk:ratio=0.1,block=8", "dgc:ratio=0.05", "powersgd:rank=2"]

parser = argparse.ArgumentParser()
parser.add_argument("--digests", default="")
parser.add_argument("--codecs", default=";".join(CODECS), help="specs separated by ;")
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))


def batch(step, salt):
    g = torch.Generator().manual_seed(1000 * hvd.rank() + 10 * step + salt)
    return torch.randn(16, 12, generator=g), torch.randn(16, 6, generator=g)


def make_opt(net, spec):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(), compression=spec)


def step(net, opt, s, salt):
    x, y = batch(s, salt)
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()


def digest(net):
    h = hashlib.sha256()
    for name, p in net.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


failures = []
digests = {}
for spec in args.codecs.split(";"):
    g_alone = model()
    opt = make_opt(g_alone, spec)
    for s in range(args.steps):
        step(g_alone, opt, s, 1)
    g, d = model(), model()
    opt_g, opt_d = make_opt(g, spec), make_opt(d, spec)
    for s in range(args.steps):
        step(d, opt_d, s, 2)   # D first, then G: their exchanges overlap in the runtime's cycles
        step(g, opt_g, s, 1)
    digests[spec] = digest(g_alone)
    if digest(g) != digests[spec]:
        diff = max((a - b).abs().max().item() for a, b in zip(g.parameters(), g_alone.parameters()))
        failures.append(f"{spec}: G beside D differs from G alone (max |diff| {diff:.3g})")
    # D's own state is D's: its optimizer's checkpoint holds only its own tensors' state, of its own size.
    sd = opt_d.state_dict()["gradcomp"]
    if not isinstance(sd, bytes):
        failures.append(f"{spec}: D's optimizer state has no gradcomp entry")

if hvd.rank() == 0 and args.digests:
    with open(args.digests, "w") as f:
        json.dump(digests, f, indent=1, sort_keys=True)
for message in failures:
    print(f"rank {hvd.rank()} [{hvd.backend()}]: {message}", file=sys.stderr)
print(f"rank {hvd.rank()} [{hvd.backend()}]: {len(digests)} codecs, {len(failures)} failures")
sys.exit(1 if failures else 0)
