"""The worker of bench/elastic: Fashion-MNIST with bench/accuracy's --full CNN, written as a horovod.torch.elastic
script (gradcomp.torch as hvd): an ElasticSampler over the training images, DistributedOptimizer with top-k and
error feedback, TorchState committed every --commit-every steps. Rank 0 appends one JSON line per event to
<out>/events.jsonl (step, resumed) and, at the end, the test accuracy to <out>/final.json; the rank told to die
writes <out>/kill.json (time, steps done) and SIGKILLs its torchrun agent and itself (the node is lost)."""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "accuracy"))
import data  # noqa: E402
import models  # noqa: E402

import gradcomp.torch as hvd  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=20)
p.add_argument("--train-subset", type=int, default=0, help="images per epoch (0: all 60,000)")
p.add_argument("--batch", type=int, default=32, help="per-rank batch (bench/accuracy --full: 32)")
p.add_argument("--lr", type=float, default=0.2, help="plain SGD, bench/accuracy --full: 0.2 (at 4 ranks; scaled "
               "with the number of ranks)")
p.add_argument("--spec", default="topk:ratio=0.01")
p.add_argument("--commit-every", type=int, default=10)
p.add_argument("--kill-epoch", type=int, default=0, help="1-based epoch in whose middle --kill-rank dies (0: none)")
p.add_argument("--kill-rank", type=int, default=3)
p.add_argument("--seed", type=int, default=1)
args = p.parse_args()

hvd.init()
torch.set_num_threads(1)
x_train, y_train = data.load("train")
x_test, y_test = (torch.from_numpy(a) for a in data.load("t10k"))
chosen = data.subset(len(y_train), args.train_subset or None, args.seed)
x_train, y_train = torch.from_numpy(x_train[chosen]), torch.from_numpy(y_train[chosen])
model = models.build("cnn", args.seed)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=args.spec)
sampler = hvd.elastic.ElasticSampler(list(range(len(y_train))), shuffle=True, seed=args.seed)


def scale_lr():
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size() / 4


def event(kind, **fields):
    if hvd.rank() == 0:
        with open(os.path.join(args.out, "events.jsonl"), "a") as f:
            f.write(json.dumps({"event": kind, "t": time.time(), "size": hvd.size(), **fields}) + "\n")


def kill_now(state):
    with open(os.path.join(args.out, "kill.json"), "w") as f:
        json.dump({"t": time.time(), "gstep": state.gstep, "epoch": state.epoch, "size": hvd.size()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


@hvd.elastic.run
def train(state):
    event("entered", gstep=state.gstep, epoch=state.epoch)
    while state.epoch < args.epochs:
        indices = list(iter(state.sampler))
        batches = (len(indices) + args.batch - 1) // args.batch
        for b in range(batches):
            if (args.kill_epoch and state.epoch == args.kill_epoch - 1 and hvd.rank() == args.kill_rank
                    and hvd.size() == 4 and b == batches // 2 and not os.path.exists(os.path.join(args.out,
                                                                                                  "kill.json"))):
                kill_now(state)
            idx = torch.tensor(indices[b * args.batch:(b + 1) * args.batch])
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
            state.sampler.record_batch(b, args.batch)
            state.gstep += 1
            event("step", gstep=state.gstep, epoch=state.epoch)
            if state.gstep % args.commit_every == 0:
                state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


def accuracy():
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x_test[i:i + 1000]).argmax(1) == y_test[i:i + 1000]).sum())
                      for i in range(0, len(y_test), 1000))
    return correct / len(y_test)


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, gstep=0)
state.register_reset_callbacks([scale_lr])
scale_lr()
train(state)
if hvd.rank() == 0:
    with open(os.path.join(args.out, "final.json"), "w") as f:
        json.dump({"accuracy": accuracy(), "gstep": state.gstep, "size": hvd.size()}, f)
