"""after/before and gradcomp/Horovod step-time ratios of compare.sh's runs (s per step; < 1: after is faster).

    python3 summary.py [FOLDER]   (default: this script's folder)
"""
import glob
import json
import os
import sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
times = {}  # (model, which, round, compression) -> s/step
for path in glob.glob(os.path.join(here, "*-*-*/results.jsonl")):
    model, which, rnd = os.path.basename(os.path.dirname(path)).split("-")
    for line in open(path):
        row = json.loads(line)
        times[(model, which, rnd, row["compression"])] = row["s_per_step"]
print("| model | compression | round | before s/step | after s/step | Horovod s/step | after / before | after : Horovod |")
print("|---|---|---|---|---|---|---|---|")
for model in ("mlp", "alexnet"):
    for comp in ("none", "fp16"):
        for rnd in sorted({k[2] for k in times}):
            b, a, h = (times.get((model, w, rnd, comp)) for w in ("before", "after", "horovod"))
            if a is None or b is None:
                continue
            hv = f"{h:.3f}" if h else "–"
            speed = f"{h / a:.2f}x" if h else "–"
            print(f"| {model} | {comp} | {rnd} | {b:.3f} | {a:.3f} | {hv} | {a / b:.3f} | {speed} |")
