"""`run.py --task lm`: the second task family of the compression-vs-accuracy sweep, a byte-level transformer language
model trained with AdamW (issue 21). This module holds what run.py needs to know about it: the presets, the
command line flags of its own, the rank command (lm_worker.py) and the titles; lm_report.py / lm_seeds.py write its
outputs. The Fashion-MNIST task stays run.py's default.
"""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))

# The eight rows, each with error feedback (ef=on is every lossy codec's default; dgc's accumulator is its
# error feedback). dgc's momentum correction is off under AdamW and its sparsity warm-up is the paper's (lm_worker).
DEFAULT_COMPRESSORS = ("none,fp16,bf16,qsgd:bits=4,onebit,topk:ratio=0.01,dgc:ratio=0.001,powersgd:rank=4")
# The same codecs compressing AdamW's momentum instead (exchange=momentum: gradcomp.torch.CompressedAdam through
# DistributedOptimizer, lm_settings.py, docs/adam.md). Every preset runs the two headline rows (top-k with the
# settings that hold it inside 2% above 10x: a 22% warm-up on 8-bit qsgd, refreshes doubling every 4); --full adds
# the others, top-k with a short fp16 warm-up, and PowerSGD at rank 16 (gradient rows with a 10% dense start, momentum
# rows with a 10% warm-up) and rank 32 (momentum, 15% warm-up).
MOMENTUM_ROWS = ("onebit:exchange=momentum,warmup=0.15,"
                 "topk:ratio=0.01,exchange=momentum,warmup=0.22,exact=qsgd8,kappa=4,precondition=on")
FULL_MOMENTUM_ROWS = ("qsgd:bits=4,exchange=momentum,warmup=0.15,"
                      "topk:ratio=0.01,exchange=momentum,warmup=0.05,exact=fp16,precondition=on,"
                      "dgc:ratio=0.001,exchange=momentum,warmup=0.05,exact=fp16,precondition=on,"
                      "powersgd:rank=4,exchange=momentum,warmup=0.1,"
                      "powersgd:rank=16,start_step=200,powersgd:rank=16,exchange=momentum,warmup=0.1,"
                      "powersgd:rank=32,exchange=momentum,warmup=0.15")


def default_compressors(full: bool) -> str:
    """The rows of a sweep without --compressors: the gradient rows, then the momentum rows (quick: the two headline
    ones, so the quick sweep stays a few minutes)."""
    return ",".join([DEFAULT_COMPRESSORS, MOMENTUM_ROWS] + ([FULL_MOMENTUM_ROWS] if full else []))

# 4 ranks x 4 windows of 128 bytes = 2,048 bytes per step; 22-30 s per 100 steps on 2 idle cores (4 ranks).
# quick: the eight gradient rows took 164 s in all on the idle machine, far from converged (the two momentum rows add
# about a quarter). full: 2,000 steps, where
# dense is clearly learned (1.82 bits per byte; at 200 steps it was still at 3.4): ~8.5 minutes per row, ~70 minutes
# per seed for the eight rows on 2 idle cores (docs/accuracy-lm.md).
PRESETS = {
    "quick": dict(steps=60, batch=4, lr=3e-3, layers=4, width=128, heads=4, context=128, evals=3),
    "full": dict(steps=2000, batch=4, lr=3e-3, layers=4, width=128, heads=4, context=128, evals=5),
}


def add_arguments(parser) -> None:
    """Adds the LM-only flags (defaults from the preset; --batch and --lr are run.py's shared flags)."""
    g = parser.add_argument_group("--task lm (byte-level transformer, AdamW)")
    g.add_argument("--steps", type=int, help="training steps per run (quick 60, --full 2000)")
    g.add_argument("--layers", type=int, help="transformer blocks (4)")
    g.add_argument("--width", type=int, help="model width (128)")
    g.add_argument("--heads", type=int, help="attention heads (4)")
    g.add_argument("--context", type=int, help="context length in bytes (128)")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (0.1)")
    g.add_argument("--evals", type=int, help="validation evaluations per run (quick 3, --full 5)")
    g.add_argument("--train-bytes", type=int, default=4_000_000, help="cap on training bytes (4,000,000)")
    g.add_argument("--val-bytes", type=int, default=262_144, help="cap on validation bytes (262,144)")
    g.add_argument("--val-windows", type=int, default=256, help="validation windows of --context bytes (256)")


def configure(args) -> None:
    """Fills the preset into every LM setting left unset, plus the defaults run.py reads for both tasks (log
    interval, timeout per seed: 3x the idle estimate of 1 s per step, at least 30 minutes)."""
    preset = PRESETS["full" if args.full else "quick"]
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.log_every <= 0:
        args.log_every = max(1, args.steps // 20)


def default_timeout(args, n_specs: int, n_seeds: int) -> float:
    """Seconds for the whole sweep: 3 s per step per compressor per seed (about 3x an idle 2-core machine), at least
    30 minutes per seed."""
    return n_seeds * max(1800.0, 3.0 * args.steps * n_specs)


def worker_command(python: str, specs_json: str, comm: str, index_base: int, run_dir: str, args) -> list[str]:
    """The rank command for one launch over `specs_json` (a JSON list)."""
    cmd = [python, os.path.join(HERE, "lm_worker.py"), "--specs", specs_json, "--comm", comm,
           "--index-base", str(index_base), "--out", run_dir, "--seed", str(args.seed),
           "--log-every", str(args.log_every), "--threads", str(args.threads)]
    for key in ("steps", "batch", "lr", "weight_decay", "layers", "width", "heads", "context", "evals",
                "train_bytes", "val_bytes", "val_windows"):
        cmd += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    return cmd


def meta(args) -> dict:
    """The LM settings recorded in accuracy.json's meta (what --combine requires to be equal, with ranks/comm)."""
    return {k: getattr(args, k) for k in ("steps", "batch", "lr", "weight_decay", "layers", "width", "heads",
                                          "context", "train_bytes", "val_bytes", "val_windows")} | {"task": "lm"}


def title(args, comm: str) -> str:
    return (f"byte-level LM (stdlib .py), transformer L{args.layers} d{args.width} ctx{args.context}, AdamW lr "
            f"{args.lr:g}, {args.ranks} ranks x {args.batch} seqs, {args.steps} steps, gradients via {comm}")


def banner(args, n_specs: int) -> str:
    return (f"LM sweep ({'full' if args.full else 'quick'}): {n_specs} compressors, {args.ranks} ranks, "
            f"transformer L{args.layers} d{args.width} ctx{args.context}, {args.steps} steps of {args.batch} "
            f"sequences/rank, AdamW lr {args.lr:g}")
