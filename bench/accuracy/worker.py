"""One rank of the accuracy benchmark: trains the model once per compressor spec, in the order given.

Started by run.py, either under mpirun (rank from OMPI_COMM_WORLD_RANK) or as one process per rank (RANK,
WORLD_SIZE). Every rank joins a small gloo process group on 127.0.0.1 (MASTER_PORT) used for the metrics only
(test-accuracy counts, loss averages) and, with --comm ddp-hook/torch, also for the gradients.

Rank 0 writes one JSON object per line prefixed with '@@ ' on stdout: events 'start', 'progress', 'eval', 'result',
'failed'. run.py renders them; nothing else on stdout is meant for parsing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adapters  # noqa: E402
import data  # noqa: E402
import models  # noqa: E402


def env_rank() -> tuple[int, int]:
    for r, w in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def emit(rank: int, event: str, **fields) -> None:
    if rank == 0:
        print("@@ " + json.dumps({"event": event, **fields}), flush=True)


def allreduce(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def evaluate(model, x: torch.Tensor, y: torch.Tensor, rank: int, world: int) -> tuple[float, float]:
    """(accuracy, mean loss) over the whole test set: each rank scores a strided shard, the counts are summed."""
    model.eval()
    correct = loss = 0.0
    with torch.no_grad():
        xs, ys = x[rank::world], y[rank::world]
        for i in range(0, len(xs), 1000):
            out = model(xs[i:i + 1000])
            loss += F.cross_entropy(out, ys[i:i + 1000], reduction="sum").item()
            correct += (out.argmax(1) == ys[i:i + 1000]).sum().item()
    correct, loss, n = allreduce([correct, loss, float(len(xs))])
    model.train()
    return correct / n, loss / n


def spec_params(spec: str) -> tuple[str, dict]:
    """'dgc:ratio=0.001,momentum=0' -> ('dgc', {'ratio': '0.001', 'momentum': '0'})."""
    name, _, rest = spec.partition(":")
    return name, dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)


def dgc_warmup_steps(total_steps: int) -> int:
    """Steps per stage of DGC's sparsity warm-up when the spec does not set warmup_steps: the paper warms up over its
    first 4 epochs (densities 25%, 6.25%, 1.56%, 0.39%, then the final ratio) of ~90-epoch ImageNet runs (the
    reference code's CIFAR config: 5 of 200 epochs), i.e. over the first ~4.4% of training. gradcomp's dgc has the
    same four stages, so each stage gets 1/90 of the run's steps."""
    return max(1, round(total_steps / 90))


def codec_spec(spec: str, momentum: float, total_steps: int) -> str:
    """The spec handed to gradcomp for the run. Identical to `spec` except for DGC, whose paper recipe has two parts
    that depend on the training run, filled in when the spec leaves them unset (Lin et al. 2018; the reference
    implementation ties both to the run the same way): the momentum of its momentum correction is the optimizer's
    momentum (`momentum`; 0 = plain accumulation), and the sparsity warm-up spans the first ~4.4% of the steps
    (dgc_warmup_steps)."""
    name, params = spec_params(spec)
    if name != "dgc":
        return spec
    extra = []
    if "momentum" not in params:
        extra.append(f"momentum={momentum:g}")
    if "warmup_steps" not in params:
        extra.append(f"warmup_steps={dgc_warmup_steps(total_steps)}")
    if not extra:
        return spec
    return spec + ("," if ":" in spec else ":") + ",".join(extra)


def optimizer_momentum(spec: str, momentum: float) -> float:
    """The SGD momentum of the run: `momentum`, except for DGC with momentum correction (momentum > 0), whose
    compressor already accumulates u = m*u + g before selecting (Lin et al. 2018): the optimizer then runs plain SGD
    on the aggregated update, or the momentum would be applied twice. `spec` is the codec spec (codec_spec())."""
    name, params = spec_params(spec)
    if name != "dgc":
        return momentum
    return momentum if float(params.get("momentum", "0.9")) == 0.0 else 0.0


def train_one(spec: str, args, rank: int, world: int, train, test) -> dict:
    xtr, ytr, subset = train
    xte, yte = test
    global_batch = args.batch * world
    steps_per_epoch = len(subset) // global_batch
    total_steps = steps_per_epoch * args.epochs
    if steps_per_epoch == 0:
        raise ValueError(f"{len(subset)} training images are fewer than one global batch ({global_batch})")
    codec = codec_spec(spec, args.momentum, total_steps)
    model = models.build(args.model, args.seed)
    momentum = optimizer_momentum(codec, args.momentum)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum,
                                weight_decay=args.weight_decay)
    wrapped = adapters.wrap(args.comm, codec, model, optimizer)
    net, opt = wrapped.model, wrapped.optimizer
    torch.manual_seed(args.seed * 1000 + rank)   # dropout masks: same for every compressor
    evals_per_epoch = max(1, args.evals_per_epoch)
    eval_steps = {min(steps_per_epoch, round(steps_per_epoch * (k + 1) / evals_per_epoch))
                  for k in range(evals_per_epoch)}
    log_every = max(1, args.log_every)
    emit(rank, "start", spec=spec, codec_spec=codec, comm=wrapped.label, momentum=momentum, steps=total_steps,
         steps_per_epoch=steps_per_epoch,
         global_batch=global_batch, params=sum(p.numel() for p in model.parameters()))

    losses, evals = [], []
    train_time = 0.0
    window = []
    step = 0
    for epoch in range(args.epochs):
        order = data.epoch_order(subset, epoch, args.seed)
        epoch_start = time.perf_counter()
        for s in range(steps_per_epoch):
            idx = order[s * global_batch + rank * args.batch: s * global_batch + (rank + 1) * args.batch]
            xb, yb = xtr[idx], ytr[idx]
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps)) if args.cosine else args.lr
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            wrapped.after_backward()
            opt.step()
            step += 1
            window.append(loss.item())
            if not math.isfinite(window[-1]):
                raise FloatingPointError(f"loss is {window[-1]} at step {step} (rank {rank})")
            if step % log_every == 0 or s + 1 == steps_per_epoch or (s + 1) in eval_steps:
                train_time += time.perf_counter() - epoch_start
                mean_loss = allreduce([sum(window) / len(window)])[0] / world
                window = []
                losses.append((step, mean_loss))
                payload, _ = wrapped.payload_bytes()
                emit(rank, "progress", spec=spec, epoch=epoch + 1, epochs=args.epochs, step=step, steps=total_steps,
                     loss=mean_loss, payload_bytes=payload, wire_bytes=wrapped.wire_bytes(), train_s=train_time)
                if (s + 1) in eval_steps:
                    acc, test_loss = evaluate(net, xte, yte, rank, world)
                    evals.append({"step": step, "epoch": step / steps_per_epoch, "train_s": train_time,
                                  "acc": acc, "loss": test_loss})
                    emit(rank, "eval", spec=spec, step=step, acc=acc, loss=test_loss, train_s=train_time)
                epoch_start = time.perf_counter()
        train_time += time.perf_counter() - epoch_start

    payload, raw = wrapped.payload_bytes()
    wire = wrapped.wire_bytes()
    payload_mean, raw_mean, wire_mean = allreduce([payload / world, raw / world, (wire or 0) / world])  # DGC's k varies
    wrapped.close()
    if not evals or evals[-1]["step"] != step:
        acc, test_loss = evaluate(net, xte, yte, rank, world)
        evals.append({"step": step, "epoch": step / steps_per_epoch, "train_s": train_time, "acc": acc,
                      "loss": test_loss})
    return {
        "spec": spec, "codec_spec": codec, "comm": args.comm, "comm_label": wrapped.label,
        "optimizer_momentum": momentum, "lr": args.lr,
        "model": args.model, "ranks": world,
        "epochs": args.epochs, "train_images": int(len(subset)), "global_batch": global_batch, "steps": step,
        "payload_bytes_per_step": payload_mean / step, "raw_bytes_per_step": raw_mean / step,
        "wire_bytes_per_step": None if wire is None else wire_mean / step,
        "compression_ratio": raw_mean / payload_mean if payload_mean else float("nan"),
        "test_acc": evals[-1]["acc"], "test_loss": evals[-1]["loss"], "train_s": train_time,
        "time_per_epoch_s": train_time / args.epochs, "loss_curve": losses, "evals": evals,
    }


def run_specs(specs: list[str], train, args, rank: int) -> int:
    """Trains each spec in turn (train(spec) -> result dict); rank 0 writes each result atomically to
    <args.out>/<index>.json and emits it. A failing spec is emitted as failed and the next still runs (gradcomp raises
    on every rank). Returns the number of failures. Used by both tasks' workers."""
    failures = 0
    for i, spec in enumerate(specs):
        try:
            result = train(spec)
        except Exception as e:  # recorded, and the next spec still runs (gradcomp raises on every rank)
            failures += 1
            emit(rank, "failed", spec=spec, error=f"{type(e).__name__}: {e}")
            if rank == 0:
                traceback.print_exc()
            continue
        if rank == 0:
            path = os.path.join(args.out, f"{args.index_base + i:02d}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(result, f)
            os.replace(path + ".tmp", path)
            emit(rank, "result", index=args.index_base + i, path=path,
                 **{k: v for k, v in result.items() if k not in ("loss_curve", "evals")})
    return failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--specs", required=True, help="JSON list of compressor specs, trained in this order")
    p.add_argument("--comm", choices=adapters.COMMS, required=True)
    p.add_argument("--model", default="mlp", choices=sorted(models.MODELS))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-subset", type=int, default=0, help="0 = all 60000 training images")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--cosine", action="store_true", help="cosine learning-rate decay to 0 over the run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--evals-per-epoch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", required=True, help="folder for one <index>.json result per spec")
    p.add_argument("--index-base", type=int, default=0, help="index of the first spec (result file names)")
    args = p.parse_args()

    rank, world = env_rank()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    adapters.init(args.comm)

    xtr, ytr = data.load("train", args.data_dir)
    xte, yte = data.load("t10k", args.data_dir)
    subset = data.subset(len(ytr), args.train_subset or None, args.seed)
    train = (torch.from_numpy(xtr), torch.from_numpy(ytr), subset)
    test = (torch.from_numpy(xte), torch.from_numpy(yte))

    run_specs(json.loads(args.specs), lambda spec: train_one(spec, args, rank, world, train, test), args, rank)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
