"""The calls of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py (written here, not copied), run on
`import gradcomp.torch as hvd`: synthetic images, a model, SGD scaled by the size (1 with --use-adasum),
DistributedOptimizer with op=hvd.Adasum / hvd.Average and Compression.fp16 / none, broadcast of parameters and
optimizer state, timeit'd steps and an img/sec report averaged with hvd.allreduce. torchvision is not installed
here, so the default model is a small CNN (--model names a torchvision model where it is available). The checks at
the end (finite loss, parameters identical on every rank) are the test's.

    mpirun -np 2 python tests/python/hvd_synthetic_benchmark.py [--use-adasum] [--fp16-allreduce]
"""
import argparse
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import gradcomp.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark (Horovod's, on gradcomp)")
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--model", type=str, default="small_cnn")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=3)
parser.add_argument("--num-iters", type=int, default=3)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
torch.set_num_threads(1)
torch.manual_seed(1234 + hvd.rank())  # different initial weights: broadcast_parameters makes them equal


def small_cnn(num_classes=1000):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, num_classes))


if args.model == "small_cnn":
    model = small_cnn()
else:
    from torchvision import models
    model = getattr(models, args.model)()

# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()
optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)

hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, 64, 64)
target = torch.LongTensor(args.batch_size).random_() % 1000
if args.cuda:
    data, target = data.cuda(), target.cuda()
losses = []


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
device = "GPU" if args.cuda else "CPU"
log(f"Number of {device}s: {hvd.size()}")

log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} +-{hvd.size() * img_sec_conf:.1f}")

# -- the test's checks ------------------------------------------------------------------------------------------------
ok = all(np.isfinite(losses))
flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
spread = (hvd.allreduce(flat, op=hvd.Max if hasattr(hvd, "Max") else None) - flat).abs().max().item() \
    if hasattr(hvd, "Max") else 0.0
mean = hvd.allreduce(flat, name="check.params")
spread = max(spread, (mean - flat).abs().max().item())
log(f"check: losses finite {ok}, parameter spread across ranks {spread:.3g}")
if not ok or spread > 1e-5:
    print(f"rank {hvd.rank()}: FAILED (finite losses {ok}, parameter spread {spread})", file=sys.stderr)
    sys.exit(1)
