"""Times Horovod's allreduce (op Average, no compression) of one float32 tensor on every rank, for the hierarchy
table beside gradcomp's allreduce_perf on the same emulated cluster (bench/net/hierarchy_table.sh). Prints one JSON
line on rank 0: the slowest rank's mean seconds per call over --iters calls after one warm-up, and whether
HOROVOD_HIERARCHICAL_ALLREDUCE was set (Horovod implements that mode for NCCL on GPUs; CPU tensors take MPI's
allreduce either way, which this measures).

    mpirun -np 4 -x HOROVOD_HIERARCHICAL_ALLREDUCE=1 .peers/horovod/bin/python bench/peers/horovod_allreduce.py
"""
import argparse
import json
import os
import time

import torch

import horovod.torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=16 << 20, help="tensor size in bytes (float32)")
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    x = torch.ones(args.bytes // 4)
    hvd.allreduce(x, name="warmup")
    times = []
    for i in range(args.iters):
        hvd.allreduce(torch.zeros(1), name=f"sync.{i}")
        start = time.perf_counter()
        out = hvd.allreduce(x, name=f"timed.{i}")
        times.append(time.perf_counter() - start)
    assert torch.equal(out, x), "Horovod's average of equal tensors changed them"
    slowest = hvd.allreduce(torch.tensor(sum(times) / len(times)), op=hvd.Max, name="slowest").item()
    if hvd.rank() == 0:
        print(json.dumps({"framework": "horovod", "spec": "none", "ranks": hvd.size(), "local_size": hvd.local_size(),
                          "bytes": args.bytes, "time_s": slowest,
                          "hierarchical_env": os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", "0")}), flush=True)


if __name__ == "__main__":
    main()
