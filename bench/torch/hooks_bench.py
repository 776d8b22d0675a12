#!/usr/bin/env python3
"""PyTorch DDP communication hooks vs gradcomp, measured in one run.

Model Linear(5000,5000) -> ReLU -> Linear(5000,10) (25M parameters), batch 8, CPU, gloo on 127.0.0.1. Rows: PyTorch's
allreduce, fp16_compress_hook and PowerSGD (rank 1) hooks, gradcomp's DDP hook (topk 1%, dgc, fp16, ...) and
gradcomp.torch.DistributedOptimizer. Each row: warm-up steps, then the mean wall time of the timed steps (the slowest
rank's). Launch it plainly (spawns --ranks processes) or under mpirun (one process per rank), e.g. on a shaped link:

    bench/net/shaped.sh 1gbit -- python3 bench/torch/hooks_bench.py --ranks 4 --json
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

DEFAULT_ROWS = ["torch:allreduce", "torch:fp16", "torch:powersgd1", "gradcomp:topk:ratio=0.01", "gradcomp:dgc",
                "gradcomp:fp16", "optimizer:topk:ratio=0.01", "optimizer:fp16"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="processes to spawn (ignored under mpirun)")
    p.add_argument("--hidden", type=int, default=5000, help="width of the first layer (5000 = 25M parameters)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per row")
    p.add_argument("--steps", type=int, default=3, help="timed steps per row")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help="comma-separated rows: torch:{allreduce,fp16,powersgd1}, gradcomp:<spec>, optimizer:<spec> "
                        "(a spec's own commas are written as '+', e.g. gradcomp:topk:ratio=0.01+ef=on)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of a table")
    return p.parse_args(argv)


def build_model(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def time_steps(step_fn, warmup, steps):
    for _ in range(warmup):
        step_fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step_fn()
    elapsed = torch.tensor([(time.perf_counter() - t0) / steps])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def run_row(row, args, rank, world):
    import gradcomp.torch as gct
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    kind, _, spec = row.partition(":")
    spec = spec.replace("+", ",")
    model = build_model(args.hidden)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.hidden, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()
    warmup = args.warmup
    if kind == "optimizer":
        if not gct.is_initialized():
            gct.init(backend=os.environ.get("GRADCOMP_BACKEND", "torch"))
        opt = gct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(), compression=spec)

        def step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        s = time_steps(step, warmup, args.steps)
        impl = f"gradcomp DistributedOptimizer ({gct.backend()})"
        opt._remove_hooks()
        return impl, spec, s
    ddp = DDP(model)
    if kind == "torch":
        if spec == "allreduce":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
            impl = "torch allreduce_hook"
        elif spec == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            impl = "torch fp16_compress_hook"
        elif spec.startswith("powersgd"):
            rank_k = int(spec[len("powersgd"):] or 1)
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank_k,
                                       start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            ddp.register_comm_hook(state, psgd.powerSGD_hook)
            impl = f"torch powerSGD_hook (rank {rank_k})"
            warmup = max(warmup, 3)
        else:
            raise SystemExit(f"hooks_bench: unknown torch row '{row}'")
    elif kind == "gradcomp":
        state, hook = gct.ddp_comm_hook(spec, model=model)
        ddp.register_comm_hook(state, hook)
        impl = "gradcomp ddp_comm_hook"
    else:
        raise SystemExit(f"hooks_bench: unknown row kind '{kind}' in '{row}'")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
    return impl, spec, time_steps(step, warmup, args.steps)


def worker(rank, world, port, args):
    torch.set_num_threads(args.threads)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = []
    baseline = None
    for row in [r for r in args.rows.split(",") if r]:
        impl, spec, s = run_row(row, args, rank, world)
        if row == "torch:allreduce":
            baseline = s
        rec = {"impl": impl, "spec": spec, "ranks": world, "step_s": round(s, 4),
               "params": sum(p.numel() for p in build_model(args.hidden).parameters()), "batch": args.batch,
               "speedup_vs_allreduce": round(baseline / s, 2) if baseline else None}
        results.append(rec)
        if rank == 0:
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{impl:42s} {spec:22s} ranks={world} step_s={s:8.3f}"
                      + (f"  x{baseline / s:5.2f} vs allreduce" if baseline else ""), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = parse_args()
    if "OMPI_COMM_WORLD_RANK" in os.environ:  # under mpirun: this process is one rank
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        import gradcomp.torch as gct
        os.environ.setdefault("GRADCOMP_TORCH_PG", "gloo")
        gct.init(backend=os.environ.get("GRADCOMP_BACKEND", "torch"))
        worker(rank, world, 0, args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.ranks, port, args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
