#!/usr/bin/env python3
"""CPU seconds an idle gradcomp fusion runtime costs each rank (the runtime backend's background thread between
steps). Run under mpirun; prints one line per rank.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x PYTHONPATH .venv/bin/python bench/torch/runtime_idle.py [--seconds 5]

GRADCOMP_IDLE_CYCLE_MAX_MS=0 (exported with -x) shows the cost without the idle back-off.
"""
import argparse
import resource
import time

import torch

import gradcomp.torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    hvd.init(backend="runtime")
    hvd.allreduce(torch.ones(4))  # every rank is up
    time.sleep(1)
    hvd.allreduce(torch.ones(4))
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0 = hvd._ctx.runtime.stats()["cycles"]
    time.sleep(args.seconds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    cycles = hvd._ctx.runtime.stats()["cycles"] - c0
    print(f"rank {hvd.rank()}: idle {args.seconds:g} s, cpu {cpu:.3f} s, {cycles} negotiation cycles", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
