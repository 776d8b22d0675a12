#!/usr/bin/env python3
"""One training script for Horovod and gradcomp side by side: the same model, data, optimizer and steps, with only the
import switched (`--framework horovod` imports horovod.torch, `gradcomp` imports gradcomp.torch, both as hvd).
Synthetic data, SGD through hvd.DistributedOptimizer, parameters broadcast from rank 0; prints one JSON line on
rank 0 with s/step and samples/s (mean over the timed steps of the slowest rank's time).

Workloads: `--model mlp` is hooks_bench's communication-bound model (Linear(5000, 5000) -> ReLU -> Linear(5000, 10),
25M parameters, batch 8); `--model alexnet` has the layer shapes of torchvision's AlexNet (61M parameters; images of
--image-size, default 224), the workload of Horovod's pytorch_synthetic_benchmark.py (written here, not copied).

Compression: none and fp16 on both (Horovod's Compression.fp16 vs gradcomp's); any gradcomp spec with gradcomp
(e.g. topk:ratio=0.01, dgc:ratio=0.001). Run under mpirun (see bench/peers/horovod.sh):
    mpirun -np 4 python bench/peers/peer_train.py --framework gradcomp --model mlp --compression topk:ratio=0.01
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=("horovod", "gradcomp"), required=True)
    p.add_argument("--model", choices=("mlp", "alexnet"), default="mlp")
    p.add_argument("--compression", default="none", help="none, fp16, or (gradcomp) a compressor spec")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224, help="alexnet input size (at least 64)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--label", default="", help="free text copied into the JSON line (e.g. the link)")
    return p.parse_args(argv)


def alexnet(num_classes=1000):
    """AlexNet's layers as torchvision defines their shapes (no torchvision here)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(),
        nn.Dropout(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
        nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, num_classes))


def build(args):
    """(model, inputs, targets) of the workload, the same on every rank (seeded)."""
    torch.manual_seed(1234)
    if args.model == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(5000, 5000), torch.nn.ReLU(), torch.nn.Linear(5000, 10))
        x, y = torch.randn(args.batch_size, 5000), torch.randint(0, 10, (args.batch_size,))
    else:
        if args.image_size < 64:
            raise SystemExit("peer_train: --image-size must be at least 64 for alexnet")
        model = alexnet()
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
        y = torch.randint(0, 1000, (args.batch_size,))
    return model, x, y


def compression_of(hvd, args):
    if args.compression == "none":
        return hvd.Compression.none
    if args.compression == "fp16":
        return hvd.Compression.fp16
    if args.framework == "horovod":
        raise SystemExit(f"peer_train: Horovod has no '{args.compression}' compression (none, fp16)")
    return args.compression  # gradcomp takes a spec string


def main(argv=None):
    args = parse_args(argv)
    if args.framework == "horovod":
        import horovod.torch as hvd
    else:
        import gradcomp.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    model, x, y = build(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression_of(hvd, args))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times, losses = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        elapsed = torch.tensor([time.perf_counter() - t0])
        times.append(hvd.allreduce(elapsed, op=hvd.Max, name=f"peer.time.{i}").item())
        if hvd.rank() == 0:
            print(f"[peer] {args.framework} {args.compression} step {i + 1}/{args.steps}: {times[-1]:.3f} s",
                  file=sys.stderr, flush=True)
    s_step = sum(times) / len(times)
    if hvd.rank() == 0:
        print(json.dumps({"framework": args.framework, "model": args.model, "compression": args.compression,
                          "ranks": hvd.size(), "batch_per_rank": args.batch_size, "s_per_step": round(s_step, 4),
                          "samples_per_s": round(args.batch_size * hvd.size() / s_step, 3),
                          "final_loss": round(losses[-1], 5), "label": args.label}), flush=True)


if __name__ == "__main__":
    main()
