#!/usr/bin/env python3
"""The momentum rows of `bench/accuracy/run.py --task lm` in miniature (issue 32): 2 ranks, the one-block width-32
transformer of lm_miniature_test.py, 40 AdamW steps of dense, gradient onebit and momentum onebit / top-k
(DistributedOptimizer(AdamW, exchange="momentum") = CompressedAdam, 10-step warm-up, variance refreshed). Fails
unless run.py exits 0 and every row ends with a finite validation bpb; the momentum rows must record the exchange,
the switch after exactly 10 exact steps, a count of exact and compressed steps that adds up to 41 (the 40
training steps and the one broadcast_optimizer_state takes on the fresh AdamW, as in the dense rows, which the
optimizer takes over as an exact step), and an end-to-end ratio (warm-up and refreshes at full size) above 1 (onebit: below the gradient row's, which has none)."""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = ["none", "onebit", "onebit:exchange=momentum,warmup=10", "topk:ratio=0.01,exchange=momentum,warmup=10"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "accuracy", "run.py"), "--task", "lm", "--ranks", "2",
           "--steps", "40", "--evals", "2", "--layers", "1", "--width", "32", "--heads", "2", "--context", "32",
           "--batch", "4", "--lr", "0.01", "--train-bytes", "200000", "--val-bytes", "20000", "--val-windows", "64",
           "--compressors", ",".join(ROWS), "--build-dir", args.build_dir, "--out", args.out, "--comm", "gradcomp",
           "--timeout", "150", "--quiet"]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, timeout=170).returncode
    failures = [f"run.py exited with {rc}"] if rc != 0 else []
    json_path = os.path.join(args.out, "accuracy.json")
    runs = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            runs = {r["spec"]: r for r in json.load(f)["runs"]}
    else:
        failures.append(f"{json_path} was not written")
    for spec in ROWS:
        row = runs.get(spec)
        if runs and (row is None or row.get("status") != "ok" or not math.isfinite(row["val_bpb"])):
            failures.append(f"no successful '{spec}' row with a finite val_bpb: {row}")
    gradient_ratio = runs.get("onebit", {}).get("compression_ratio", float("nan"))
    for spec in ROWS[2:]:
        row = runs.get(spec)
        if not row or row.get("status") != "ok":
            continue
        adam = row.get("compressed_adam") or {}
        print(f"{spec}: ratio {row['compression_ratio']:.2f}x, bpb {row['val_bpb']:.3f}, optimizer {adam}")
        if row.get("exchange") != "momentum" or adam.get("switched_at") != 10:
            failures.append(f"'{spec}': exchange {row.get('exchange')!r}, switched at {adam.get('switched_at')!r} "
                            "(expected momentum, 10)")
        if adam.get("exact_steps", 0) + adam.get("compressed_steps", 0) != 41 or adam.get("exact_steps", 0) <= 10:
            failures.append(f"'{spec}': {adam.get('exact_steps')} exact + {adam.get('compressed_steps')} compressed "
                            "steps (expected 41: 40 and broadcast_optimizer_state's; more than 10 exact: warm-up "
                            "and refreshes)")
        ratio = row["compression_ratio"]
        if not ratio > 1.0 or (spec.startswith("onebit") and not ratio < gradient_ratio):
            failures.append(f"'{spec}': end-to-end ratio {ratio} is not above 1 (onebit: and below the gradient "
                            f"row's {gradient_ratio}, which has no exact steps)")
    print("\n".join(f"FAIL: {f}" for f in failures) or "PASS")
    return int(bool(failures))


if __name__ == "__main__":
    sys.exit(main())
