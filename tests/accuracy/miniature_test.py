#!/usr/bin/env python3
"""The accuracy benchmark in miniature: bench/accuracy/run.py on 2 ranks, 1 epoch over 6,400 images, dense and top-k
1% through gradcomp (MPI path when available). Fails unless both runs finish, accuracy.csv holds them with sane values
(dense > 70% test accuracy, top-k's compression ratio from gradcomp's payload stats > 10), and accuracy.png is a PNG.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--comm", default="auto")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "accuracy", "run.py"), "--ranks", "2", "--epochs", "1",
           "--train-subset", "6400", "--compressors", "none,topk:ratio=0.01", "--build-dir", args.build_dir,
           "--out", args.out, "--comm", args.comm, "--timeout", "200"]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, timeout=230).returncode
    failures = []
    if rc != 0:
        failures.append(f"run.py exited with {rc}")
    csv_path = os.path.join(args.out, "accuracy.csv")
    png_path = os.path.join(args.out, "accuracy.png")
    rows = {}
    if os.path.exists(csv_path):
        with open(csv_path) as f:
            rows = {r["spec"]: r for r in csv.DictReader(f)}
    else:
        failures.append(f"{csv_path} was not written")
    if not os.path.exists(png_path):
        failures.append(f"{png_path} was not written")
    else:
        with open(png_path, "rb") as f:
            head = f.read(8)
        size = os.path.getsize(png_path)
        if head != b"\x89PNG\r\n\x1a\n" or size < 10_000:
            failures.append(f"{png_path} is not a plausible PNG ({size} bytes, header {head!r})")
    dense, topk = rows.get("none"), rows.get("topk:ratio=0.01")
    if rows and (dense is None or dense["status"] != "ok"):
        failures.append(f"no successful dense row in the CSV: {dense}")
    elif dense is not None:
        acc = float(dense["test_acc"])
        if not acc > 0.70:
            failures.append(f"dense test accuracy {acc:.4f} is not > 0.70")
        if abs(float(dense["compression_ratio"]) - 1.0) > 0.05:
            failures.append(f"dense compression ratio {dense['compression_ratio']} is not ~1")
    if rows and (topk is None or topk["status"] != "ok"):
        failures.append(f"no successful topk row in the CSV: {topk}")
    elif topk is not None:
        ratio = float(topk["compression_ratio"])
        if not ratio > 10:
            failures.append(f"topk 1% compression ratio {ratio} is not > 10")
        if not float(topk["test_acc"]) > 0.5:
            failures.append(f"topk 1% test accuracy {topk['test_acc']} is not > 0.5")
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
