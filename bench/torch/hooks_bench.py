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
import resource
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
                        "(a spec's own commas are written as '+', e.g. gradcomp:topk:ratio=0.01+ef=on); "
                        "adamw:<spec> (DistributedOptimizer(AdamW): the gradient compressed) and "
                        "adamw-momentum:<spec> (the same with exchange='momentum': CompressedAdam after one exact "
                        "step, v frozen, so every timed step compresses the momentum); floors, not "
                        "competitors: floor:compute (DDP with a hook that returns the bucket without communicating: "
                        "forward + backward + SGD, what no hook can remove) and floor:wire_fp16 (only the collectives "
                        "of a float16 sum of the model's gradient size: all_to_all + all_gather of 2 bytes per "
                        "parameter, the ring allreduce's bytes, no compute)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of a table")
    return p.parse_args(argv)


def build_model(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


PHASES = {}  # phase -> seconds summed over the timed steps of the current row (this rank)
_timing = [False]


def phase(name, t0):
    """Adds the time since t0 to `name` (during timed steps) and returns now."""
    t = time.perf_counter()
    if _timing[0]:
        PHASES[name] = PHASES.get(name, 0.0) + t - t0
    return t


def time_steps(step_fn, warmup, steps):
    for _ in range(warmup):
        step_fn()
    dist.barrier()
    PHASES.clear()
    _timing[0] = True
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(steps):
        step_fn()
    elapsed = torch.tensor([(time.perf_counter() - t0) / steps])
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    _timing[0] = False
    for k in PHASES:
        PHASES[k] /= steps
    # CPU seconds this process (every thread: autograd, hook worker, runtime, MPI/gloo) spent per step: on a shared,
    # oversubscribed machine a steadier measure of overhead than wall time.
    PHASES["cpu"] = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / steps
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def training_step(model, opt, loss_fn, x, y):
    """One timed training step of `model` with `opt`, recording the fwd / bwd / step phases."""
    def step():
        t = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        t = phase("fwd", t)
        loss.backward()
        t = phase("bwd", t)
        opt.step()
        phase("step", t)
    return step


def run_row(row, args, rank, world):
    import gradcomp.torch as gct
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    kind, _, spec = row.partition(":")
    spec = spec.replace("+", ",")
    model = build_model(args.hidden)
    loss_fn = torch.nn.CrossEntropyLoss()
    warmup = args.warmup
    if kind == "floor" and spec == "wire_fp16":
        # The split sum's collectives alone (docs/ddp-hook.md): as many bytes per rank as a float16 ring allreduce.
        numel = sum(p.numel() for p in model.parameters())
        m = (numel + world - 1) // world
        send = torch.zeros(world * m, dtype=torch.float16)
        chunks = torch.empty_like(send)
        mine = torch.zeros(m, dtype=torch.float16)

        def wire_step():
            dist.all_to_all_single(chunks.view(torch.uint8), send.view(torch.uint8))
            dist.all_gather(list(send.view(torch.uint8).view(world, 2 * m).unbind(0)), mine.view(torch.uint8))
        return "floor: fp16 wire (all_to_all + all_gather, no compute)", f"{numel} x f16", \
            time_steps(wire_step, warmup, args.steps)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.hidden, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    if kind in ("optimizer", "adamw", "adamw-momentum"):
        if not gct.is_initialized():
            gct.init(backend="torch")  # spawned ranks: torch.distributed is already up
        # Row-specific names: the runtime keeps residuals per name for the whole run.
        named = [(f"{row}/{n}", p) for n, p in model.named_parameters()]
        base = torch.optim.SGD(model.parameters(), lr=0.01) if kind == "optimizer" else \
            torch.optim.AdamW(model.parameters(), lr=1e-4)
        momentum = dict(exchange="momentum", exchange_options=dict(warmup=1, variance="frozen", verbose=False)) \
            if kind == "adamw-momentum" else {}
        opt = gct.DistributedOptimizer(base, named_parameters=named, compression=spec, **momentum)

        s = time_steps(training_step(model, opt, loss_fn, x, y), warmup, args.steps)
        impl = f"gradcomp DistributedOptimizer{'(AdamW)' if kind == 'adamw' else ''}" \
            f"{'(AdamW, exchange=momentum)' if momentum else ''} ({gct.backend()})"
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
    elif kind == "floor" and spec == "compute":
        def nocomm_hook(_, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor())
            return fut
        ddp.register_comm_hook(None, nocomm_hook)
        impl = "floor: DDP, hook without communication"
    elif kind == "gradcomp":
        state, hook = gct.ddp_comm_hook(spec, model=model)
        ddp.register_comm_hook(state, hook)
        impl = "gradcomp ddp_comm_hook"
    else:
        raise SystemExit(f"hooks_bench: unknown row kind '{kind}' in '{row}'")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    return impl, spec, time_steps(training_step(ddp, opt, loss_fn, x, y), warmup, args.steps)


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
               "speedup_vs_allreduce": round(baseline / s, 2) if baseline else None,
               "rank0_phases_s": {k: round(v, 4) for k, v in PHASES.items()}}
        results.append(rec)
        if rank == 0:
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{impl:42s} {spec:22s} ranks={world} step_s={s:8.3f}"
                      + (f"  x{baseline / s:5.2f} vs allreduce" if baseline else ""), flush=True)
    dist.barrier()
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        dist.destroy_process_group()


def main():
    args = parse_args()
    if "OMPI_COMM_WORLD_RANK" in os.environ:  # under mpirun: this process is one rank
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        import gradcomp.torch as gct
        os.environ.setdefault("GRADCOMP_TORCH_PG", "gloo")
        gct.init()  # the default under mpirun: gradcomp's C++ runtime (GRADCOMP_BACKEND overrides)
        if not torch.distributed.is_initialized():  # the DDP rows need a gloo group as well
            import datetime
            port = gct._rendezvous_port() + 1
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=300))
        worker(rank, world, 0, args)
        if not gct._ctx.owns_process_group:
            dist.destroy_process_group()
        gct.shutdown()
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.ranks, port, args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
