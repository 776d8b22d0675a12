"""One rank of `run.py --task lm`: trains the byte-level transformer (lm_model.py) on the standard-library corpus
(lm_data.py) with AdamW once per compressor spec, in the order given, through the same gradient path as the
Fashion-MNIST sweep (adapters.wrap: gradcomp.torch.DistributedOptimizer under mpirun, or the DDP hook).

Rank 0 writes '@@ {json}' events like worker.py ('start', 'progress', 'eval', 'result', 'failed') and one
<index>.json result per spec into --out. The metric is the validation loss in bits per byte (nats / ln 2) over a
fixed set of validation windows that the ranks score in strided shards.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adapters  # noqa: E402
import lm_data  # noqa: E402
import lm_model  # noqa: E402
import lm_settings  # noqa: E402
from worker import allreduce, codec_spec, emit, env_rank, run_specs  # noqa: E402

LN2 = math.log(2.0)


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up from peak/warmup to `peak` over `warmup` steps, then cosine decay to peak/10 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def evaluate(model, val, rank: int, world: int) -> float:
    """Validation bits per byte over all of `val` = (inputs, targets): rank r scores windows r, r+world, ...; the
    summed nats and byte counts are allreduced over the metrics group."""
    vx, vy = val
    model.eval()
    nats = 0.0
    with torch.no_grad():
        xs, ys = vx[rank::world], vy[rank::world]
        for i in range(0, len(xs), 16):
            nats += lm_model.loss_nats(model(xs[i:i + 16]), ys[i:i + 16], reduction="sum").item()
    nats, count = allreduce([nats, float(ys.numel())])
    model.train()
    return nats / count / LN2


def train_one(spec: str, args, rank: int, world: int, train, val) -> dict:
    """One run of `spec`: fresh model and AdamW from args.seed, args.steps steps; returns the result record."""
    total = args.steps
    # DGC: no momentum correction (AdamW keeps its own moments; DGC's correction is for SGD's heavy ball), the
    # paper's sparsity warm-up over the first ~4.4% of the steps (worker.codec_spec).
    # exchange=momentum rows: gradcomp.torch.CompressedAdam through DistributedOptimizer(AdamW, exchange="momentum").
    base, bench = lm_settings.split(spec)
    dense_steps, momentum = lm_settings.dense_steps(bench), lm_settings.momentum_options(bench, total)
    codec = codec_spec(base, 0.0, total)
    model = lm_model.build(args.seed, args.layers, args.width, args.heads, args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    wrapped = adapters.wrap(args.comm, codec, model, optimizer, dense_steps, momentum)
    net, opt = wrapped.model, wrapped.optimizer
    warmup = args.warmup if args.warmup >= 0 else max(1, total // 20)
    eval_steps = {max(1, round(total * (k + 1) / args.evals)) for k in range(args.evals)}
    params = sum(p.numel() for p in model.parameters())
    emit(rank, "start", spec=spec, codec_spec=codec, comm=wrapped.label, momentum=0.0, steps=total, unit="sequences",
         optimizer=f"AdamW lr {args.lr:g}" + (f", {dense_steps} dense steps first" if dense_steps else "")
         + (", momentum compressed" if momentum else ""),
         steps_per_epoch=total, global_batch=args.batch * world, params=params)

    losses, evals, window = [], [], []
    train_time, tick = 0.0, time.perf_counter()
    for step in range(total):
        starts = lm_data.batch_offsets(len(train), args.context, step, args.seed, rank, world, args.batch)
        x, y = lm_data.windows(train, starts, args.context)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, warmup, args.lr)
        opt.zero_grad()
        loss = lm_model.loss_nats(net(x), y)
        loss.backward()
        wrapped.after_backward()
        opt.step()
        window.append(loss.item() / LN2)
        if not math.isfinite(window[-1]):
            raise FloatingPointError(f"loss is {window[-1]} at step {step + 1} (rank {rank})")
        done = step + 1
        if done % args.log_every == 0 or done in eval_steps:
            train_time += time.perf_counter() - tick
            mean_bpb = allreduce([sum(window) / len(window)])[0] / world
            window = []
            losses.append((done, mean_bpb))
            payload, _ = wrapped.payload_bytes()
            emit(rank, "progress", spec=spec, epoch=1, epochs=1, step=done, steps=total, loss=mean_bpb,
                 payload_bytes=payload, wire_bytes=wrapped.wire_bytes(), train_s=train_time)
            if done in eval_steps:
                bpb = evaluate(net, val, rank, world)
                evals.append({"step": done, "train_s": train_time, "bpb": bpb})
                emit(rank, "eval", spec=spec, step=done, bpb=bpb, acc=float("nan"), train_s=train_time)
            tick = time.perf_counter()
    train_time += time.perf_counter() - tick

    payload, raw = wrapped.payload_bytes()
    wire = wrapped.wire_bytes()
    payload_mean, raw_mean, wire_mean = allreduce([payload / world, raw / world, (wire or 0) / world])
    adam = wrapped.optimizer_stats()
    wrapped.close()
    return {
        "spec": spec, "codec_spec": codec, "dense_steps": dense_steps, "comm": args.comm, "comm_label": wrapped.label,
        "task": "lm", "exchange": bench.get("exchange", "gradient"), "compressed_adam": adam,
        "lr": args.lr, "weight_decay": args.weight_decay, "warmup": warmup, "model": lm_model_name(args),
        "params": params, "ranks": world, "steps": total, "global_batch": args.batch * world,
        "tokens_per_step": args.batch * world * args.context,
        "payload_bytes_per_step": payload_mean / total, "raw_bytes_per_step": raw_mean / total,
        "wire_bytes_per_step": None if wire is None else wire_mean / total,
        "compression_ratio": raw_mean / payload_mean if payload_mean else float("nan"),
        "val_bpb": evals[-1]["bpb"], "train_s": train_time, "time_per_100_steps_s": 100.0 * train_time / total,
        "loss_curve": losses, "evals": evals,
    }


def lm_model_name(args) -> str:
    return f"transformer L{args.layers} d{args.width} h{args.heads} ctx{args.context}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--specs", required=True, help="JSON list of compressor specs, trained in this order")
    p.add_argument("--comm", choices=adapters.COMMS, required=True)
    p.add_argument("--out", required=True, help="folder for one <index>.json result per spec")
    p.add_argument("--index-base", type=int, default=0)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="sequences per rank per step")
    p.add_argument("--lr", type=float, required=True, help="AdamW peak learning rate")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=-1, help="learning-rate warm-up steps (default steps/20)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--train-bytes", type=int, default=4_000_000)
    p.add_argument("--val-bytes", type=int, default=262_144)
    p.add_argument("--val-windows", type=int, default=256)
    p.add_argument("--evals", type=int, default=10, help="validation evaluations per run (evenly spaced)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--corpus-dir", default=None)
    args = p.parse_args()

    rank, world = env_rank()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    adapters.init(args.comm)
    train, _ = lm_data.load("train", args.train_bytes, args.corpus_dir)
    val_bytes, _ = lm_data.load("val", args.val_bytes, args.corpus_dir)
    val = lm_data.windows(val_bytes, lm_data.val_starts(len(val_bytes), args.context, args.val_windows), args.context)

    run_specs(json.loads(args.specs), lambda spec: train_one(spec, args, rank, world, train, val), args, rank)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
