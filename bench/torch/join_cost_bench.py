#!/usr/bin/env python3
"""What join support costs a DistributedOptimizer step while no rank is joined: step time and join's control traffic.

A small MLP (--layers Linear(width, width) layers, so a step is short and a fixed per-step cost shows) trained with
SGD through gradcomp.torch.DistributedOptimizer on the backend GRADCOMP_BACKEND names (mpi, torch, runtime), under
mpirun. Prints one JSON line per compression: the mean step time of the slowest rank over the timed steps, and per
step the control rounds join_protocol ran and the notes join_notes sent (0 when the module has no notes), and the
control bytes this rank contributed (40 per round). Compare two builds by running it from each (docs/performance.md):

    GRADCOMP_BACKEND=mpi mpirun -np 2 .venv/bin/python bench/torch/join_cost_bench.py
"""
import argparse
import json
import time

import torch

import gradcomp.torch as hvd
from gradcomp.torch import join_protocol

try:
    from gradcomp.torch import join_notes
except ImportError:  # a build from before the notes
    join_notes = None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6, help="Linear layers (each a weight and a bias)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--compressions", default="none,fp16", help="comma-separated gradcomp specs")
    p.add_argument("--label", default="", help="copied into each JSON line (e.g. before/after)")
    return p.parse_args(argv)


def run(args, spec):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=spec)
    x = torch.randn(args.batch, args.width)
    rounds = notes = 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            hvd.barrier()
            start = time.perf_counter()
            rounds = join_protocol.rounds
            notes = join_notes.notes_sent if join_notes else 0
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    elapsed = time.perf_counter() - start
    rounds = (join_protocol.rounds - rounds) / args.steps
    notes = ((join_notes.notes_sent if join_notes else 0) - notes) / args.steps
    slowest = hvd.allreduce(torch.tensor([elapsed], dtype=torch.float64), op=hvd.Max, name="bench.time").item()
    return {"label": args.label, "backend": hvd.backend(), "ranks": hvd.size(), "compression": spec,
            "parameters": sum(p.numel() for p in model.parameters()), "tensors": 2 * args.layers,
            "step_ms": round(1000 * slowest / args.steps, 4), "control_rounds_per_step": rounds,
            "control_bytes_per_step": 40 * rounds, "notes_per_step": notes}


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    for spec in args.compressions.split(","):
        row = run(args, spec)
        if hvd.rank() == 0:
            print(json.dumps(row), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
