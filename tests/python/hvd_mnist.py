"""The calls of Horovod's examples/pytorch/pytorch_mnist.py (written here, not copied), run on
`import gradcomp.torch as hvd`: DistributedSampler partitions, a small CNN, SGD with the learning rate scaled by the
size (1 with --use-adasum), DistributedOptimizer with op=hvd.Adasum / hvd.Average, Compression.fp16 / none and
gradient_predivide_factor, broadcast of parameters and optimizer state, metric averages with hvd.allreduce. Data:
Debian's Fashion-MNIST (dataset-fashion-mnist, /usr/share/datasets/fashion-mnist; --train-samples of it) or, when it
is absent, a synthetic 28x28 set. The checks at the end (accuracy above chance, parameters identical on every rank)
are the test's.

    mpirun -np 2 python tests/python/hvd_mnist.py [--gradient-predivide-factor 2] [--use-adasum] [--fp16-allreduce]
"""
import argparse
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import gradcomp.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST example (Horovod's, on gradcomp)")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--test-batch-size", type=int, default=500)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)  # Horovod: 0.01 over 10 epochs
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--train-samples", type=int, default=3072)
parser.add_argument("--test-samples", type=int, default=1000)
parser.add_argument("--min-accuracy", type=float, default=0.5)


def read_idx(path, limit):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
    return torch.from_numpy(arr[:limit].copy())


def dataset(train, limit, data_dir):
    prefix = "train" if train else "t10k"
    images = os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")
    if os.path.exists(images):
        x = read_idx(images, limit).float().div(255).sub(0.2860).div(0.3530).unsqueeze(1)
        y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), limit).long()
    else:  # synthetic: each class a fixed pattern plus noise
        g = torch.Generator().manual_seed(0)
        patterns = torch.randn(10, 1, 28, 28, generator=g)
        g.manual_seed(1 if train else 2)
        y = torch.randint(0, 10, (limit,), generator=g)
        x = patterns[y] + 2.0 * torch.randn(limit, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(epoch):
    model.train()
    # Horovod: set epoch to sampler for shuffling.
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)} "
                  f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}", flush=True)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def evaluate(model, test_loader, test_sampler, cuda):
    """Horovod's test(): loss and accuracy of this rank's partition, averaged over the ranks with hvd.allreduce."""
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    for data, target in test_loader:
        if cuda:
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


def start(args):
    """Horovod's start-up: init, seeds, one CPU thread, DistributedSampler partitions of the training and test data.
    Returns (train_sampler, train_loader, test_sampler, test_loader)."""
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
    return train_sampler, train_loader, test_sampler, test_loader


def model_and_optimizer(args):
    """Horovod's Net and SGD, the learning rate scaled by the size (1 with Adasum; the local size on GPUs)."""
    model = Net()
    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1
    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()

    # Horovod: scale learning rate by lr_scaler.
    return model, optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)


def test():
    return evaluate(model, test_loader, test_sampler, args.cuda)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    train_sampler, train_loader, test_sampler, test_loader = start(args)
    model, optimizer = model_and_optimizer(args)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        accuracy = test()

    # -- the test's checks ----------------------------------------------------------------------------------------------
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    spread = (hvd.allreduce(flat, name="check.params") - flat).abs().max().item()
    if accuracy < args.min_accuracy or spread > 1e-5:
        print(f"rank {hvd.rank()}: FAILED (accuracy {accuracy:.3f} < {args.min_accuracy} or parameter spread "
              f"{spread:.3g})", file=sys.stderr)
        sys.exit(1)
