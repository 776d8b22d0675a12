"""A finished DDP script must exit with its own exit code: two models, each with its own gradcomp DDP hook, train a few
steps on gloo and the script ends — with dist.destroy_process_group() (--destroy) or without any teardown, as user
scripts do. test_exit_clean.py runs it 20 times each way under mpirun and requires exit code 0 every time (a rank that
aborts at exit fails the whole mpirun job after the training succeeded).

    mpirun -np 2 python tests/python/two_hooks_exit.py --init file:///tmp/somewhere [--destroy]
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

import gradcomp.torch as gct  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True, help="torch.distributed init_method shared by the ranks")
    p.add_argument("--destroy", action="store_true", help="call dist.destroy_process_group() at the end")
    p.add_argument("--spec", default="topk:ratio=0.05")
    args = p.parse_args()
    helpers.watchdog(60)
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=args.init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    models = [helpers.make_model(0), helpers.make_model(0)]
    ddps = [DDP(m) for m in models]
    opts = []
    for m, d in zip(models, ddps):
        state, hook = gct.ddp_comm_hook(args.spec, model=m)
        d.register_comm_hook(state, hook)
        opts.append(torch.optim.SGD(d.parameters(), lr=0.01))
    for step in range(3):
        for d, o in zip(ddps, opts):
            o.zero_grad()
            helpers.loss_of(d, helpers.make_batch(step, rank)).backward()
            o.step()
    if args.destroy:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
