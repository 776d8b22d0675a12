"""A worker of the elastic tests (test_elastic_torchrun.py), written as a horovod.torch.elastic script: only the
import line is gradcomp's. It trains a small MLP on data drawn from (step, rank), commits every --commit-every
steps, and writes progress.json (rank 0) and final-<rank>.json (every rank, at the end) into --out.

--kill RANK:STEP:WHERE makes that rank SIGKILL itself at that step: WHERE = allreduce (inside the first collective
operation of the step's gradient exchange), compress (inside the codec's compress(), a Python codec wrapping fp16),
commit (after the commit file is written, before it is renamed into place); with --kill-agent its torchrun agent is
killed first (the node is lost, the job shrinks); without, the agent restarts the worker in place.
"""
import argparse
import hashlib
import json
import os
import signal
import sys

import torch
import torch.nn.functional as F

import gradcomp
import gradcomp.torch as hvd
from gradcomp.torch import exchange
from gradcomp.torch.elastic import store as elastic_store

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--commit-every", type=int, default=1)
parser.add_argument("--spec", default="topk:ratio=0.05")
parser.add_argument("--out", required=True)
parser.add_argument("--kill", default="")
parser.add_argument("--kill-agent", action="store_true")
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--until-size", type=int, default=0, help="after --steps, go on (up to --max-steps) until the "
                    "job has this many ranks, then 3 steps more")
parser.add_argument("--max-steps", type=int, default=200)
args = parser.parse_args()

_armed = {"on": False}


def _die():
    sys.stderr.write(f"elastic_train: rank {hvd.rank()} killing itself{' and its agent' if args.kill_agent else ''}\n")
    sys.stderr.flush()
    if args.kill_agent:
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class KillableHalf:
    """fp16 codec whose compress() kills the process when armed (the 'compress' kill point)."""

    @staticmethod
    def compress(tensor):
        if _armed["on"]:
            _die()
        return tensor.to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


kill_rank, kill_step, kill_where = (args.kill.split(":") + ["", "", ""])[:3] if args.kill else (None, None, None)
if args.kill:
    kill_rank, kill_step = int(kill_rank), int(kill_step)
spec = args.spec
if kill_where == "compress":
    gradcomp.register_compressor("killable_half", KillableHalf)
    spec = "killable_half"
elif kill_where == "allreduce":
    for op in ("allreduce", "allgather", "allgatherv"):
        original = getattr(exchange.ProcessGroupAdapter, op)

        def patched(self, *a, _original=original):
            if _armed["on"]:
                _die()
            return _original(self, *a)
        setattr(exchange.ProcessGroupAdapter, op, patched)
elif kill_where == "commit":
    _replace = os.replace

    def replace(src, dst):
        if _armed["on"] and dst.endswith(".gcstate"):
            _die()
        return _replace(src, dst)
    elastic_store.os.replace = replace

hvd.init()
torch.manual_seed(1234)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
base_lr = 0.05
optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=spec)


def on_reset():
    for group in optimizer.param_groups:
        group["lr"] = base_lr


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    return x, (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()


def params_digest():
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def write_json(name, obj):
    tmp = os.path.join(args.out, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(args.out, name))


@hvd.elastic.run
def train(state):
    def more():
        if state.step < args.steps:
            return True
        if args.until_size and state.step < args.max_steps:
            grown = [i for i, n in enumerate(state.history) if n >= args.until_size]
            return not grown or state.step < grown[0] + 3
        return False

    while more():
        if args.kill and hvd.rank() == kill_rank and state.step == kill_step and \
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            _armed["on"] = kill_where != "commit"
        x, y = batch(state.step, hvd.rank())
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        state.step += 1
        state.history.append(hvd.size())
        if args.step_sleep:
            import time
            time.sleep(args.step_sleep)
        if state.step % args.commit_every == 0:
            if args.kill and kill_where == "commit" and hvd.rank() == kill_rank and state.step == kill_step and \
                    os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                _armed["on"] = True
            state.commit()
        if hvd.rank() == 0:
            write_json("progress.json", {"step": state.step, "size": hvd.size()})


state = hvd.elastic.TorchState(model, optimizer, step=0, history=[])
state.register_reset_callbacks([on_reset])
train(state)
write_json(f"final-{hvd.rank()}.json", {"rank": hvd.rank(), "size": hvd.size(), "step": state.step,
                                        "history": state.history, "digest": params_digest(),
                                        "gc_step": optimizer._step_count_gc,
                                        "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))})
