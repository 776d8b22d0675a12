#!/usr/bin/env python3
"""Summarizes run.sh's output files into summary.md: per network, workload and codec, each round's fused and
unfused step times and speedup, the one-4-byte-allreduce cost and the load average before each run. The folder is
this script's, or the one given as the first argument (run.sh's $OUT); summary.md goes there."""
import pathlib
import re
import sys

here = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent
rows, probes = {}, {}
for net in ("shared", "hosts"):
    for workload in ("small", "resnet50"):
        text = (here / f"{workload}-{net}.txt").read_text()
        for run in text.split("# done")[:-1]:
            load = re.search(r"commit \S+ load ([0-9.]+)", run).group(1)
            probe = re.search(r"here: ([0-9.]+) us", run).group(1)
            probes.setdefault((net, workload), []).append(f"{float(probe):.0f}")
            for line in run.splitlines():
                f = line.split()
                if len(f) > 8 and f[0] == workload:
                    rows.setdefault((net, workload, f[1]), []).append(
                        (float(f[5]) * 1e3, float(f[6]) * 1e3, float(f[7]), load, f[8], f[9]))
out = ["| network | workload | spec | fused / unfused step (ms), per round | speedup per round | messages |",
       "|---|---|---|---|---|---|"]
for (net, workload, spec), runs in rows.items():
    times = "; ".join(f"{a:.1f} / {b:.1f}" for a, b, *_ in runs)
    speedups = " / ".join(f"{s:.2f}x" for _, _, s, *_ in runs)
    out.append(f"| {net} | {workload} | {spec} | {times} | {speedups} | {runs[0][4]} vs {runs[0][5]} |")
out.append("")
out.append("One 4-byte allreduce (median of 50, µs), per run: " + "; ".join(
    f"{net} {workload}: {', '.join(v)}" for (net, workload), v in probes.items()))
out.append("")
out.append("Load average (1 min) before each run, in file order: " + "; ".join(
    f"{net} {workload}: {', '.join(r[3] for r in rows[(net, workload, 'none')])}" for (net, workload) in probes))
(here / "summary.md").write_text("\n".join(out) + "\n")
print("\n".join(out))
