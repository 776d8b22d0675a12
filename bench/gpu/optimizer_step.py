"""One-process DistributedOptimizer step on CUDA parameters (bench/gpu/check.sh runs it when a CUDA PyTorch and the
gradcomp module are importable). Times backward + step of a ~25M-parameter MLP with each compressor and prints one
line per compressor and a summary line last:

    optimizer_step: cuda, backend torch (nccl), 25.2M params, none 12.3 ms, fp16 ..., topk:ratio=0.01 ... per step

usage: python3 bench/gpu/optimizer_step.py [--steps N] [--specs a,b,...] [--backend torch|runtime]
"""
import argparse
import os
import sys
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per compressor (after 2 untimed)")
    parser.add_argument("--specs", default="none,fp16,topk:ratio=0.01,dgc:ratio=0.001",
                        help="comma-separated compressor specs (default: %(default)s)")
    parser.add_argument("--backend", default="torch", choices=["torch", "runtime"],
                        help="gradcomp backend (runtime needs mpirun; default: %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="dry run on CPU parameters (checks the script itself)")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("optimizer_step: no CUDA device visible to PyTorch (not measured)")
        return 0
    os.environ.setdefault("GRADCOMP_MASTER_ADDR", "127.0.0.1")
    import gradcomp.torch as hvd
    hvd.init(backend=args.backend)
    torch.manual_seed(0)
    device = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    results = []
    for spec in args.specs.split(","):
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048),
                                    torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(device)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters(), compression=spec)
        data = torch.randn(256, 4096, device=device)
        target = torch.randint(0, 10, (256,), device=device)
        elapsed = 0.0
        for step in range(2 + args.steps):
            sync()
            start = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()
            sync()
            if step >= 2:
                elapsed += time.perf_counter() - start
        for p in model.parameters():
            if not torch.isfinite(p).all():
                raise SystemExit(f"optimizer_step: {spec}: non-finite parameters after {2 + args.steps} steps")
        params = sum(p.numel() for p in model.parameters())
        ms = 1000 * elapsed / args.steps
        print(f"optimizer_step {spec}: {ms:.2f} ms/step, {params / 1e6:.1f}M params", flush=True)
        results.append(f"{spec} {ms:.1f} ms")
    rank = hvd.rank()
    hvd.shutdown()
    # One write per line: the ranks of an MPI run share the output.
    sys.stdout.write(f"optimizer_step rank {rank}: {device.type}, backend {args.backend}, {params / 1e6:.1f}M params, "
                     + ", ".join(results) + " per step\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
