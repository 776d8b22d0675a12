"""The calls of Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py (written here, not copied), run on
`import gradcomp.torch as hvd` under torchrun's elastic agent. Its start-up, model, optimizer and test() are those of
Horovod's pytorch_mnist.py, shared with hvd_mnist.py (hvd.init(), a DistributedSampler built from hvd.size()/
hvd.rank() at start-up, SGD with the learning rate scaled by the size, metric averages with hvd.allreduce; Debian's
Fashion-MNIST instead of torchvision's MNIST download, which is not possible here); this file adds the elastic part:
DistributedOptimizer (Compression.fp16 / none, op=hvd.Adasum / hvd.Average), hvd.elastic.TorchState(model,
optimizer, epoch=1, batch=0) with a reset callback that rescales the learning rate, @hvd.elastic.run over epochs and
batches with state.commit() after every batch. What follows the marked line at the end is the test's
(test_elastic_torchrun.py): progress and final files under --out, checks of accuracy and identical parameters.

    python -m torch.distributed.run --nnodes=2:4 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=H:P \\
        tests/python/hvd_mnist_elastic.py [--fp16-allreduce] [--use-adasum]
"""
import hashlib
import json
import os
import sys

import torch
import torch.nn.functional as F

import gradcomp.torch as hvd
from hvd_mnist import evaluate, model_and_optimizer, parser, start

parser.description = "PyTorch MNIST elastic example (Horovod's, on gradcomp)"
parser.add_argument("--out", default="", help="(the test's) where progress.json and final-<rank>.json go")
parser.set_defaults(log_interval=5)
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()
train_sampler, train_loader, test_sampler, test_loader = start(args)  # hvd.init(), seeds, partitioned loaders
model, optimizer = model_and_optimizer(args)  # Net, SGD with the learning rate scaled by the size
# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


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
accuracy = evaluate(model, test_loader, test_sampler, args.cuda)

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
