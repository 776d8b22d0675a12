"""Combining sweeps that differ only in --seed: one row per compressor with the mean test accuracy and the mean of the
paired differences to the dense run of the same seed.

One run's final test accuracy moves by a few tenths of a point with the seed (initial weights, data order, dropout):
the test set's own binomial standard error at 91% is 0.29 pp, and dense alone moved 0.74 pp between seeds 1 and 2 of
--full. A compressor's Δ is therefore measured per seed against that seed's dense run (same weights, same data order,
so the seed's luck cancels as far as the trajectories stay alike) and averaged; the table gives its standard error.
"""
from __future__ import annotations

import csv
import json
import math
import os

import report

# Settings that must agree between the sweeps being combined (everything but the seed and the compressor list).
SAME_SETTINGS = ("model", "epochs", "train_subset", "batch", "lr", "momentum", "cosine", "ranks", "comm", "link")

CSV_FIELDS = ("spec", "status", "seeds", "n_seeds", "compression_ratio", "payload_bytes_per_step",
              "wire_bytes_per_step", "test_acc_mean", "test_acc_sd", "delta_pp_mean", "delta_pp_se", "delta_pp_min",
              "delta_pp_max", "deltas_pp", "test_accs", "time_per_epoch_s", "model", "epochs", "lr", "ranks", "error")


def load(path: str) -> dict:
    """A sweep's accuracy.json ({'meta', 'runs'}), given the file or the folder holding it."""
    if os.path.isdir(path):
        path = os.path.join(path, "accuracy.json")
    with open(path) as f:
        sweep = json.load(f)
    if not isinstance(sweep, dict) or "meta" not in sweep or "runs" not in sweep:
        raise ValueError(f"{path}: not an accuracy.json written by bench/accuracy/run.py (no 'meta'/'runs')")
    sweep["path"] = path
    return sweep


def check_settings(sweeps: list[dict], settings: tuple = SAME_SETTINGS) -> None:
    """Raises ValueError naming the setting and both files when two sweeps were not run alike (seed aside):
    `settings`, the meta keys that must agree (default this task's)."""
    first = sweeps[0]
    for other in sweeps[1:]:
        for key in settings:
            a, b = first["meta"].get(key), other["meta"].get(key)
            if a != b:
                raise ValueError(f"cannot combine: '{key}' is {a!r} in {first['path']} but {b!r} in {other['path']}; "
                                 "only the seed and the compressor list may differ")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _sd(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def runs_by_spec(sweeps: list[dict]) -> tuple[dict[str, dict[int, dict]], dict[str, list[str]]]:
    """({spec: {seed: successful run}}, {spec: ["seed N: error", ...]}), specs in first-seen order; a spec run twice
    for the same seed keeps the later sweep's run."""
    by_spec: dict[str, dict[int, dict]] = {}
    errors: dict[str, list[str]] = {}
    for sweep in sweeps:
        seed = sweep["meta"]["seed"]
        for run in sweep["runs"]:
            by_spec.setdefault(run["spec"], {})
            if run.get("status") == "ok":
                by_spec[run["spec"]][seed] = run
            else:
                errors.setdefault(run["spec"], []).append(f"seed {seed}: {run.get('error', 'failed')}")
    return by_spec, errors


def combine(sweeps: list[dict]) -> list[dict]:
    """One row per spec: the dense run ('none') first, the others in first-seen order, so partial sweeps of one seed
    (say, `none,randomk` and then the other seven) combine into the usual table. A spec run twice for the same seed
    keeps the later sweep's run.
    Failed runs are not averaged; a spec with no successful run is a failed row carrying the errors."""
    check_settings(sweeps)
    by_spec, errors = runs_by_spec(sweeps)
    dense = next((runs for spec, runs in by_spec.items() if report.codec(spec) == "none" and runs), {})
    rows = []
    order = sorted(by_spec, key=lambda spec: report.codec(spec) != "none")  # stable: first-seen order otherwise
    for spec in order:
        runs = by_spec[spec]
        if not runs:
            rows.append({"spec": spec, "status": "failed", "error": "; ".join(errors.get(spec, ["no result"]))})
            continue
        seeds = sorted(runs)
        accs = [runs[s]["test_acc"] for s in seeds]
        paired = [s for s in seeds if s in dense]
        deltas = [100.0 * (runs[s]["test_acc"] - dense[s]["test_acc"]) for s in paired]
        sd = _sd(deltas)
        rows.append({
            "spec": spec, "status": "ok", "seeds": seeds, "n_seeds": len(seeds),
            "compression_ratio": _mean([runs[s]["compression_ratio"] for s in seeds]),
            "payload_bytes_per_step": _mean([runs[s]["payload_bytes_per_step"] for s in seeds]),
            "wire_bytes_per_step": (None if any(runs[s].get("wire_bytes_per_step") is None for s in seeds)
                                    else _mean([runs[s]["wire_bytes_per_step"] for s in seeds])),
            "test_acc_mean": _mean(accs), "test_acc_sd": _sd(accs), "test_accs": accs,
            "delta_pp_mean": _mean(deltas) if deltas else None,
            "delta_pp_se": None if sd is None else sd / math.sqrt(len(deltas)),
            "delta_pp_min": min(deltas) if deltas else None, "delta_pp_max": max(deltas) if deltas else None,
            "deltas_pp": deltas, "paired_seeds": paired,
            "time_per_epoch_s": _mean([runs[s]["time_per_epoch_s"] for s in seeds]),
            "model": runs[seeds[0]]["model"], "epochs": runs[seeds[0]]["epochs"], "lr": runs[seeds[0]]["lr"],
            "ranks": runs[seeds[0]]["ranks"], "error": "; ".join(errors.get(spec, [])),
            "loss_curve": runs[seeds[0]]["loss_curve"], "curve_seed": seeds[0],
        })
    return rows


def table(rows: list[dict]) -> str:
    """The combined table as aligned text: mean ± sd of the accuracy, mean ± standard error of the paired Δ, and
    each seed's Δ."""
    head = ["compressor", "ratio", "payload/step/rank", "seeds", "test acc (mean ± sd)", "Δ vs none (mean ± se)",
            "Δ per seed", "s/epoch"]
    lines = []
    for r in rows:
        if r["status"] != "ok":
            lines.append([r["spec"], "FAILED", r.get("error", "")[:90]])
            continue
        sd = r["test_acc_sd"]
        acc = f"{100 * r['test_acc_mean']:.2f}%" + ("" if sd is None else f" ± {100 * sd:.2f}")
        if r["delta_pp_mean"] is None:
            delta = "n/a"
        else:
            se = r["delta_pp_se"]
            delta = f"{r['delta_pp_mean']:+.2f}" + ("" if se is None else f" ± {se:.2f}") + " pp"
        per_seed = " / ".join(f"{d:+.2f}" for d in r["deltas_pp"]) or "-"
        lines.append([r["spec"], f"{r['compression_ratio']:.1f}x", report.human_bytes(r["payload_bytes_per_step"]),
                      ",".join(str(s) for s in r["seeds"]), acc, delta, per_seed, f"{r['time_per_epoch_s']:.1f}"])
    return report.aligned(head, lines)


def write_csv(rows: list[dict], path: str, fields: list[str] | None = None) -> None:
    """The combined rows as CSV (`fields`, default this sweep's CSV_FIELDS; lists joined by spaces)."""
    fields = fields or CSV_FIELDS
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            out = {}
            for k in fields:
                v = r.get(k)
                if isinstance(v, list):
                    v = " ".join(f"{x:.4f}" if isinstance(x, float) else str(x) for x in v)
                out[k] = "" if v is None else v
            w.writerow(out)


def write_json(rows: list[dict], sweeps: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump({"combined_from": [s["path"] for s in sweeps], "meta": [s["meta"] for s in sweeps],
                   "rows": rows}, f, indent=1)


def write_png(rows: list[dict], path: str, title: str) -> None:
    """The single-sweep plot (report.write_png) drawn from the means: one point per compressor at its mean accuracy,
    with a bar spanning the seeds' lowest to highest accuracy; the loss curves are the first seed's."""
    plotted = [dict(r, test_acc=r["test_acc_mean"],
                    acc_range=(min(r["test_accs"]), max(r["test_accs"]))) if r["status"] == "ok" else r
               for r in rows]
    report.write_png(plotted, path, title)


def write_combined(paths: list[str], out: str) -> int:
    """Combines per-seed sweeps (their folders or accuracy.json files) into <out>/accuracy.{csv,json,png} with
    combine() and prints the table. Returns 1 when a compressor has no successful run, else 0."""
    sweeps = [load(p) for p in paths]
    rows = combine(sweeps)
    os.makedirs(out, exist_ok=True)
    meta = sweeps[0]["meta"]
    used = sorted({s["meta"]["seed"] for s in sweeps})
    print(f"\ncombined {len(sweeps)} sweep(s), seeds {','.join(map(str, used))}: Δ is each seed's accuracy minus that "
          "seed's dense run, averaged (± its standard error)")
    print(table(rows))
    csv_path = os.path.join(out, "accuracy.csv")
    png_path = os.path.join(out, "accuracy.png")
    write_csv(rows, csv_path)
    write_json(rows, sweeps, os.path.join(out, "accuracy.json"))
    title = (f"Fashion-MNIST, {meta['model']}, {meta['ranks']} ranks, {meta['epochs']} epoch(s), gradients via "
             f"{meta['comm']}; mean of seeds {','.join(map(str, used))} (bars: lowest to highest seed)")
    drawn = report.plot(write_png, rows, png_path, title)
    print(f"\nwrote {csv_path}" + (f", {png_path}" if drawn else ""))
    return 1 if any(r["status"] != "ok" for r in rows) else 0
