"""The calls of Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py (written here, not copied), run on
`import gradcomp.torch as hvd` under torchrun's elastic agent: a DistributedSampler built from hvd.size()/hvd.rank()
at start-up, SGD with the learning rate scaled by the size, DistributedOptimizer (Compression.fp16 / none,
op=hvd.Adasum / hvd.Average), hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0) with a reset callback that
rescales the learning rate, @hvd.elastic.run over epochs and batches with state.commit() after every batch, and metric
averages with hvd.allreduce. Against Horovod's script only the import line and the data differ: Debian's
Fashion-MNIST (hvd_mnist.dataset: /usr/share/datasets/fashion-mnist, --train-samples of it; torchvision's MNIST
download is not possible here). What follows the marked line at the end is the test's (test_elastic_torchrun.py):
progress and final files under --out, checks of accuracy and identical parameters.

    python -m torch.distributed.run --nnodes=2:4 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=H:P \\
        tests/python/hvd_mnist_elastic.py [--fp16-allreduce] [--use-adasum]
"""
import argparse
import hashlib
import json
import os
import sys

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import gradcomp.torch as hvd
from hvd_mnist import Net, dataset

parser = argparse.ArgumentParser(description="PyTorch MNIST elastic example (Horovod's, on gradcomp)")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--test-batch-size", type=int, default=500)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)  # Horovod: 0.01 over 10 epochs
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=5)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--train-samples", type=int, default=3072)
parser.add_argument("--test-samples", type=int, default=1000)
parser.add_argument("--out", default="", help="(the test's) where progress.json and final-<rank>.json go")
parser.add_argument("--min-accuracy", type=float, default=0.5, help="(the test's) fail below this test accuracy")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

# Horovod: initialize library.
hvd.init()
torch.manual_seed(args.seed)
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
    torch.cuda.manual_seed(args.seed)
# Horovod: limit # of CPU threads to be used per worker.
torch.set_num_threads(1)

train_dataset = dataset(True, args.train_samples, args.data_dir)
# Horovod: use DistributedSampler to partition the training data.
train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(),
                                                                rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
test_dataset = dataset(False, args.test_samples, args.data_dir)
test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(),
                                                               rank=hvd.rank())
test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

model = Net()
# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()
# Horovod: scale learning rate by lr_scaler.
optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def progress(epoch, batch):  # (the test's) where training is, for the harness that kills a node
    if args.out and hvd.rank() == 0:
        tmp = os.path.join(args.out, "progress.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"epoch": epoch, "batch": batch, "size": hvd.size()}, f)
        os.replace(tmp, os.path.join(args.out, "progress.json"))


@hvd.elastic.run
def train(state):
    # post synchronization event (worker added, worker removed) init ...
    for state.epoch in range(state.epoch, args.epochs + 1):
        state.model.train()
        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch
        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()
            if state.batch % args.log_interval == 0:
                # Horovod: use train_sampler to determine the number of examples in this worker's partition.
                print(f"Train Epoch: {state.epoch} [{state.batch * len(data)}/{len(train_sampler)} "
                      f"({100.0 * state.batch / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}", flush=True)
                progress(state.epoch, state.batch)
            state.commit()
        state.batch = 0


def test():
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    for data, target in test_loader:
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        output = model(data)
        test_loss += F.nll_loss(output, target, reduction="sum").item()
        pred = output.data.max(1, keepdim=True)[1]
        test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum().item()
    # Horovod: use test_sampler to determine the number of examples in this worker's partition.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    # Horovod: average metric values across workers.
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n", flush=True)
    return test_accuracy


# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)


# adjust learning rate on reset
def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
accuracy = test()

# -- the test's: every rank's result, then the checks ------------------------------------------------------------------
flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
spread = (hvd.allreduce(flat, name="check.params") - flat).abs().max().item()
if args.out:
    with open(os.path.join(args.out, f"final-{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "accuracy": accuracy, "spread": spread,
                   "lr": optimizer.param_groups[0]["lr"],
                   "digest": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}, f)
if accuracy < args.min_accuracy or spread > 1e-5:
    print(f"rank {hvd.rank()}: FAILED (accuracy {accuracy:.3f} < {args.min_accuracy} or parameter spread "
          f"{spread:.3g})", file=sys.stderr)
    sys.exit(1)
