#!/usr/bin/env python3
"""`bench/accuracy/run.py --task lm` in miniature: 2 ranks, a one-block width-32 transformer on 32-byte windows,
40 AdamW steps of dense ('none') and top-k 1% through gradcomp (MPI path when available). Fails unless run.py
exits 0, accuracy.csv holds both rows with a finite validation bits-per-byte, accuracy.png and val_curves.png are
PNGs, top-k's ratio (from gradcomp's payload stats) is > 10, and dense's loss falls: its training loss (8 bits per
byte for the initial near-uniform guess) drops by more than 1.5 bits, and its validation bpb ends below 6 bits and
below its first evaluation's.
"""
import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_png(path: str, failures: list[str]) -> None:
    if not os.path.exists(path):
        failures.append(f"{path} was not written")
        return
    with open(path, "rb") as f:
        head = f.read(8)
    if head != PNG_MAGIC or os.path.getsize(path) < 10_000:
        failures.append(f"{path} is not a plausible PNG ({os.path.getsize(path)} bytes, header {head!r})")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--comm", default="auto")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "accuracy", "run.py"), "--task", "lm", "--ranks", "2",
           "--steps", "40", "--evals", "4", "--layers", "1", "--width", "32", "--heads", "2", "--context", "32",
           "--batch", "4", "--lr", "0.01", "--train-bytes", "200000", "--val-bytes", "20000", "--val-windows", "64",
           "--compressors", "none,topk:ratio=0.01", "--build-dir", args.build_dir, "--out", args.out,
           "--comm", args.comm, "--timeout", "90"]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, timeout=110).returncode
    failures = []
    if rc != 0:
        failures.append(f"run.py exited with {rc}")
    csv_path = os.path.join(args.out, "accuracy.csv")
    rows = {}
    if os.path.exists(csv_path):
        with open(csv_path) as f:
            rows = {r["spec"]: r for r in csv.DictReader(f)}
    else:
        failures.append(f"{csv_path} was not written")
    check_png(os.path.join(args.out, "accuracy.png"), failures)
    check_png(os.path.join(args.out, "val_curves.png"), failures)
    for spec in ("none", "topk:ratio=0.01"):
        row = rows.get(spec)
        if rows and (row is None or row["status"] != "ok" or not math.isfinite(float(row["val_bpb"] or "nan"))):
            failures.append(f"no successful '{spec}' row with a finite val_bpb in the CSV: {row}")
    if "topk:ratio=0.01" in rows and rows["topk:ratio=0.01"]["status"] == "ok":
        ratio = float(rows["topk:ratio=0.01"]["compression_ratio"])
        if not ratio > 10:
            failures.append(f"topk 1% compression ratio {ratio} is not > 10")
    json_path = os.path.join(args.out, "accuracy.json")
    if os.path.exists(json_path):
        with open(json_path) as f:
            dense = next((r for r in json.load(f)["runs"] if r["spec"] == "none" and r.get("status") == "ok"), None)
        if dense is not None:
            first, last = dense["evals"][0]["bpb"], dense["evals"][-1]["bpb"]
            print(f"dense validation bpb {first:.3f} (step {dense['evals'][0]['step']}) -> {last:.3f}")
            if not (last < first and last < 6.0):
                failures.append(f"dense validation bpb did not fall below 6 bits: {first:.3f} -> {last:.3f}")
            train = [loss for _, loss in dense["loss_curve"]]
            print(f"dense training bpb {train[0]:.3f} (step {dense['loss_curve'][0][0]}) -> {train[-1]:.3f}")
            if not train[-1] < train[0] - 1.5:
                failures.append(f"dense training loss did not fall by 1.5 bits: {train[0]:.3f} -> {train[-1]:.3f}")
    else:
        failures.append(f"{json_path} was not written")
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
