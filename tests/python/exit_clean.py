"""Runs a few steps of the DDP hook and of DistributedOptimizer, then exits normally without any explicit teardown
(as a user script does). test_exit_clean.py runs it in a subprocess and fails if the interpreter's exit printed
nanobind's "leaked ..." warnings (a C++ object kept alive past shutdown by a reference the package forgot).

    mpirun -np 2 python tests/python/exit_clean.py            # hook on gloo + optimizer on the runtime backend
    python tests/python/exit_clean.py --spawn 2               # hook + optimizer on the torch backend, 2 processes
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import helpers  # noqa: E402

import gradcomp.torch as hvd  # noqa: E402


def train(rank, specs):
    for spec in specs:
        # The DDP hook (the exchange worker thread) ...
        model = helpers.make_model(seed=0)
        ddp = DDP(model)
        state, hook = hvd.ddp_comm_hook(spec, model=model)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for step in range(2):
            opt.zero_grad()
            helpers.loss_of(ddp, helpers.make_batch(step, rank)).backward()
            opt.step()
        del ddp  # torch 1.13: the Reducer must go before the process group (helpers.release)
        # ... and the optimizer on the initialized backend (runtime under mpirun, torch under --spawn).
        model = helpers.make_model(seed=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=[(f"{spec}/{n}", p) for n, p in model.named_parameters()],
                                       compression=spec)
        for step in range(2):
            opt.zero_grad()
            helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
            opt.step()
        opt.state_dict()  # touches save_state on the runtime backend


def _spawned(rank, world, url, specs):
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(world), GRADCOMP_TORCH_PG="gloo")
    hvd.init(backend="torch")
    train(rank, specs)
    # No shutdown(): interpreter exit must release everything by itself.


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--spawn", type=int, default=0, help="spawn N gloo ranks (torch backend) instead of mpirun")
    p.add_argument("--specs", default="topk:ratio=0.05,fp16")
    args = p.parse_args()
    specs = args.specs.split(",")
    helpers.watchdog(150)
    if args.spawn:
        import torch.multiprocessing as mp
        mp.spawn(_spawned, args=(args.spawn, helpers.rendezvous(), specs), nprocs=args.spawn, join=True)
        return 0
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    hvd.init()  # default under mpirun: the C++ fusion runtime
    if not dist.is_initialized():  # the hook needs a gloo group
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{hvd._rendezvous_port() + 1}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=90))
    train(rank, specs)
    return 0  # no shutdown(), no destroy_process_group(): exit as user scripts do


if __name__ == "__main__":
    sys.exit(main())
