#!/usr/bin/env python3
"""Tables and plots of bench/sim/run.sh's results.jsonl: the validation against the emulated clusters, and for each
model the simulated time per allreduce (flat, hierarchical, auto) beside the alpha-beta model's prediction
(bench/net/scaling_model.py, fed the simulated platform's links and codec throughput).

    python3 bench/sim/report.py results-sim/results.jsonl [more.jsonl ...] --out results-sim
"""
import argparse
import json
import math
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "net"))
import scaling_model  # noqa: E402

# The emulated clusters measured on the development VM (docs/performance-peers.md, "Flat vs hierarchical on emulated
# hosts"), 16 MiB, ms per call (mean of 3, slowest rank). 2 x 2: the two 2026-12-02 launches with our ring and the
# median learn_links (measurements/2026-12-02-hierarchy/raw-median-{1,2}.jsonl), averaged. 4 x 1 flat none/fp16:
# with our ring (ring-vs-mpi-by-layout.txt); the rest of 4 x 1: 2026-12-01 20:32 (measurements/2026-12-01-hierarchy),
# before the ring, which those rows do not use except hierarchical none and fp16 (marked).
EMULATED = {
    ("2x2", "flat"): {"none": 179.5, "fp16": 94.5, "qsgd:bits=4": 62, "topk:ratio=0.01": 37, "dgc:ratio=0.001": 26.5},
    ("2x2", "hier"): {"none": 213, "fp16": 129, "qsgd:bits=4": 94, "topk:ratio=0.01": 62.5, "dgc:ratio=0.001": 66},
    ("4x1", "flat"): {"none": 237, "fp16": 125, "qsgd:bits=4": 86, "topk:ratio=0.01": 39, "dgc:ratio=0.001": 36},
    ("4x1", "hier"): {"none": 351, "fp16": 226, "qsgd:bits=4": 141, "topk:ratio=0.01": 98, "dgc:ratio=0.001": 80},
}
BEFORE_RING = {("4x1", "hier", "none"), ("4x1", "hier", "fp16")}
SPECS = ["none", "fp16", "qsgd:bits=4", "topk:ratio=0.01", "dgc:ratio=0.001", "powersgd:rank=4"]
SHORT = {"none": "none", "fp16": "fp16", "qsgd:bits=4": "qsgd 4-bit", "topk:ratio=0.01": "topk 1%",
         "dgc:ratio=0.001": "dgc 0.1%", "powersgd:rank=4": "powersgd r4"}


def spec_of(row):
    """The real codec's spec of a row: sim_topk:ratio=0.01,gbps=1000 -> topk:ratio=0.01."""
    spec = row["spec"]
    if spec.startswith("sim_"):
        spec = spec[4:]
        name, _, params = spec.partition(":")
        kept = [p for p in params.split(",") if p and not p.startswith("gbps=")]
        spec = name + (":" + ",".join(kept) if kept else "")
    return spec


def load(paths):
    """Every row of the results files, in order; a later row of the same part, layout or rate, ranks, mode and spec
    replaces an earlier one (a run repeated into another folder; the baseline repeated at the head of each table)."""
    rows = {}
    for path in paths:
        for line in open(path):
            if line.startswith("{") and '"spec"' in line:
                row = json.loads(line)
                row["codec"] = spec_of(row)
                key = (row.get("part"), row.get("layout"), row.get("gbit"), row["ranks"], row["mode"], row["spec"])
                rows[key] = row
    return list(rows.values())


def validation(rows):
    lines = ["| layout | mode | spec | simulated ms | emulated ms | simulated / emulated |", "|---|---|---|---|---|---|"]
    for row in rows:
        if row.get("part") != "validate" or row["mode"] == "auto":
            continue
        ref = EMULATED.get((row["layout"], row["mode"]), {}).get(row["codec"])
        if ref is None:
            continue
        note = " (before the ring)" if (row["layout"], row["mode"], row["codec"]) in BEFORE_RING else ""
        lines.append(f"| {row['layout']} | {row['mode']} | {SHORT[row['codec']]} | {row['time_s'] * 1e3:.1f} | "
                     f"{ref}{note} | {row['time_s'] * 1e3 / ref:.2f} |")
    return "\n".join(lines)


def auto_rows(rows, part_filter):
    """'auto' choices: (key) -> (took, time) and whether it took the faster fixed mode."""
    lines = []
    table = {}
    for row in rows:
        if not part_filter(row):
            continue
        key = (row.get("layout") or row.get("gbit"), row["ranks"], row["codec"])
        table.setdefault(key, {})[row["mode"]] = row
    ok = total = 0
    for key, modes in sorted(table.items(), key=lambda kv: str(kv[0])):
        if not {"flat", "hier", "auto"} <= modes.keys():
            continue
        took = "hier" if modes["auto"]["algorithm"].endswith("+hier") else "flat"
        faster = "hier" if modes["hier"]["time_s"] < modes["flat"]["time_s"] else "flat"
        total += 1
        ok += took == faster
        if took != faster:
            lines.append(f"auto took {took} for {key} (flat {modes['flat']['time_s'] * 1e3:.3f} ms, hier "
                         f"{modes['hier']['time_s'] * 1e3:.3f} ms)")
    return ok, total, lines


def model_args(gbps):
    # The alpha-beta model fed the simulated platform: 400 GB/s inside a node, 4 us per message across nodes (the two
    # NICs' 2 us), the same codec throughput.
    return SimpleNamespace(gpu_codec_gbps=gbps, intra_gbps=400.0, gpu_alpha_us=4.0)


def predicted_ms(codec, ranks, nbytes, gbit, hierarchical, gbps):
    if codec not in scaling_model.RATIOS and codec != "none":
        return None
    return 1e3 * scaling_model.step_time(codec, ranks, nbytes, gbit, model_args(gbps), hierarchical)


def scale_table(rows, part):
    sel = [r for r in rows if r.get("part") == part]
    grid = {}
    for r in sel:
        grid.setdefault((r["gbit"], r["ranks"], r["codec"]), {})[r["mode"]] = r
    lines = ["| Gbit/s | ranks | spec | flat ms (model) | hierarchical ms (model) | auto ms (took) | speedup vs dense "
             "flat / best |", "|---|---|---|---|---|---|---|"]
    for (gbit, ranks, codec), modes in sorted(grid.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                             SPECS.index(kv[0][2]))):
        dense = grid.get((gbit, ranks, "none"), {}).get("flat")
        cells = []
        for mode, hier in (("flat", False), ("hier", True)):
            r = modes.get(mode)
            pred = predicted_ms(codec, ranks, r["bytes"] if r else 0, gbit, hier, r.get("gbps", 1000) if r else 1000)
            cells.append("–" if r is None else f"{r['time_s'] * 1e3:.2f}" + (f" ({pred:.2f})" if pred else ""))
        a = modes.get("auto")
        cells.append("–" if a is None else f"{a['time_s'] * 1e3:.2f} ({'hier' if a['algorithm'].endswith('+hier') else 'flat'})")
        best = min((m["time_s"] for m in modes.values()), default=None)
        speed = "–"
        if dense and best:
            flat = modes.get("flat")
            speed = f"{dense['time_s'] / flat['time_s']:.2f} / {dense['time_s'] / best:.2f}" if flat else "–"
        lines.append(f"| {gbit} | {ranks} | {SHORT[codec]} | {cells[0]} | {cells[1]} | {cells[2]} | {speed} |")
    return "\n".join(lines)


def plot(rows, part, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sel = [r for r in rows if r.get("part") == part and r["mode"] in ("flat", "hier")]
    gbits = sorted({r["gbit"] for r in sel})
    if not gbits:
        return
    fig, axes = plt.subplots(1, len(gbits), figsize=(5 * len(gbits), 4), sharey=True, squeeze=False)
    for ax, gbit in zip(axes[0], gbits):
        for i, codec in enumerate(SPECS):
            for mode, style in (("flat", "-"), ("hier", "--")):
                pts = sorted((r["ranks"], r["time_s"] * 1e3) for r in sel
                             if r["gbit"] == gbit and r["codec"] == codec and r["mode"] == mode)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=f"C{i}",
                            label=f"{SHORT[codec]} {mode}" if gbit == gbits[0] else None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{part}: {gbit} Gbit/s per node")
        ax.set_xlabel("ranks (8 per node)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("simulated ms per allreduce")
    fig.legend(loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results.jsonl files of bench/sim/run.sh (later ones win)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = load(args.results)
    parts = []
    if any(r.get("part") == "validate" for r in rows):
        ok, total, misses = auto_rows(rows, lambda r: r.get("part") == "validate")
        parts += ["## Validation (emulated clusters, 16 MiB, real CPU codecs)", "", validation(rows), "",
                  f"auto took the faster mode in {ok} of {total} rows", *misses, ""]
    for part in ("scale", "transformer"):
        if any(r.get("part") == part for r in rows):
            ok, total, misses = auto_rows(rows, lambda r, p=part: r.get("part") == p)
            parts += [f"## {part}", "", scale_table(rows, part), "",
                      f"auto took the faster mode in {ok} of {total} rows", *misses, ""]
            plot(rows, part, os.path.join(args.out, f"sim-{part}.png"))
    walls = sorted(((r.get("wall_s", 0), r.get("part"), r.get("ranks"), r.get("gbit"), r.get("mode"))
                    for r in rows), reverse=True)
    if walls:
        parts += [f"longest smpirun: {walls[0][0]} s ({walls[0][1:]})", ""]
    with open(os.path.join(args.out, "tables.md"), "w") as f:
        f.write("\n".join(parts))
    print("\n".join(parts))


if __name__ == "__main__":
    main()
