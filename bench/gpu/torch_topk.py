#!/usr/bin/env python3
"""The peer for gradcomp's CUDA top-k: torch.topk of |x| on the GPU, timed with CUDA events (median of N runs).

usage: torch_topk.py [--numel 64M] [--ratio 0.01] [--reps 10]
Prints one line "torch_topk numel=N k=K ms=T" (T includes abs(), as gradcomp's top-k selects by |v| too).
Exits 2 when PyTorch or a CUDA device is missing.
"""
import argparse
import sys


def parse_size(text):
    text = text.strip()
    scale = {"M": 1 << 20, "K": 1 << 10}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale != 1 else text) * scale


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", default="64M")
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_topk: PyTorch is not installed")
        return 2
    if not torch.cuda.is_available():
        print("torch_topk: PyTorch has no CUDA device")
        return 2
    n = parse_size(args.numel)
    k = max(1, int(n * args.ratio))
    x = torch.randn(n, device="cuda") * 0.01
    times = []
    for rep in range(args.reps + 1):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        values, indices = torch.topk(x.abs(), k, sorted=False)
        stop.record()
        torch.cuda.synchronize()
        if rep:
            times.append(start.elapsed_time(stop))
    times.sort()
    print(f"torch_topk numel={n} k={k} ms={times[len(times) // 2]:.4f} torch={torch.__version__} "
          f"device={torch.cuda.get_device_name(0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
