"""Combining `--task lm` sweeps that differ only in --seed (seeds.py's counterpart for the LM metric): one row per
compressor with the mean validation bits per byte and the mean of the paired differences to the same seed's dense
run, in percent of dense's validation loss, ± its standard error."""
from __future__ import annotations

import json
import math
import os

import lm_report
import report
import seeds

# Settings that must agree between the sweeps being combined (everything but the seed and the compressor list).
SAME_SETTINGS = ("task", "steps", "batch", "lr", "weight_decay", "layers", "width", "heads", "context",
                 "train_bytes", "val_bytes", "val_windows", "ranks", "comm")

CSV_FIELDS = ("spec", "status", "seeds", "n_seeds", "compression_ratio", "payload_bytes_per_step",
              "wire_bytes_per_step", "val_bpb_mean", "val_bpb_sd", "delta_pct_mean", "delta_pct_se", "deltas_pct",
              "val_bpbs", "time_per_100_steps_s", "model", "steps", "lr", "ranks", "error")


def combine(sweeps: list[dict]) -> list[dict]:
    """One row per spec, dense first, the others in first-seen order; a spec run twice for one seed keeps the later
    run. delta_pct per seed = 100 * (bpb - dense bpb) / dense bpb of that seed. Failed runs are not averaged."""
    seeds.check_settings(sweeps, SAME_SETTINGS)
    by_spec, errors = seeds.runs_by_spec(sweeps)
    dense = next((runs for spec, runs in by_spec.items() if report.codec(spec) == "none" and runs), {})
    rows = []
    for spec in sorted(by_spec, key=lambda s: report.codec(s) != "none"):
        runs = by_spec[spec]
        if not runs:
            rows.append({"spec": spec, "status": "failed", "error": "; ".join(errors.get(spec, ["no result"]))})
            continue
        seed_list = sorted(runs)
        bpbs = [runs[s]["val_bpb"] for s in seed_list]
        deltas = [100.0 * (runs[s]["val_bpb"] - dense[s]["val_bpb"]) / dense[s]["val_bpb"]
                  for s in seed_list if s in dense]
        sd = seeds._sd(deltas)
        first = runs[seed_list[0]]
        rows.append({
            "spec": spec, "status": "ok", "seeds": seed_list, "n_seeds": len(seed_list),
            "compression_ratio": seeds._mean([runs[s]["compression_ratio"] for s in seed_list]),
            "payload_bytes_per_step": seeds._mean([runs[s]["payload_bytes_per_step"] for s in seed_list]),
            "wire_bytes_per_step": (None if any(runs[s].get("wire_bytes_per_step") is None for s in seed_list)
                                    else seeds._mean([runs[s]["wire_bytes_per_step"] for s in seed_list])),
            "val_bpb_mean": seeds._mean(bpbs), "val_bpb_sd": seeds._sd(bpbs), "val_bpbs": bpbs,
            "delta_pct_mean": seeds._mean(deltas) if deltas else None,
            "delta_pct_se": None if sd is None else sd / math.sqrt(len(deltas)), "deltas_pct": deltas,
            "time_per_100_steps_s": seeds._mean([runs[s]["time_per_100_steps_s"] for s in seed_list]),
            "model": first["model"], "steps": first["steps"], "lr": first["lr"], "ranks": first["ranks"],
            "error": "; ".join(errors.get(spec, [])), "loss_curve": first["loss_curve"], "evals": first["evals"],
            "curve_seed": seed_list[0],
        })
    return rows


def table(rows: list[dict]) -> str:
    """Aligned text: mean ± sd of the validation bpb, mean ± se of the paired Δ (% of dense), each seed's Δ."""
    head = ["compressor", "ratio", "payload/step/rank", "seeds", "val bpb (mean ± sd)", "Δ vs none (mean ± se)",
            "Δ per seed", "s/100 steps"]
    lines = []
    for r in rows:
        if r["status"] != "ok":
            lines.append([r["spec"], "FAILED", r.get("error", "")[:90]])
            continue
        sd, se = r["val_bpb_sd"], r["delta_pct_se"]
        bpb = f"{r['val_bpb_mean']:.4f}" + ("" if sd is None else f" ± {sd:.4f}")
        delta = ("n/a" if r["delta_pct_mean"] is None else
                 f"{r['delta_pct_mean']:+.2f}" + ("" if se is None else f" ± {se:.2f}") + " %")
        lines.append([r["spec"], f"{r['compression_ratio']:.1f}x", report.human_bytes(r["payload_bytes_per_step"]),
                      ",".join(map(str, r["seeds"])), bpb, delta,
                      " / ".join(f"{d:+.2f}" for d in r["deltas_pct"]) or "-", f"{r['time_per_100_steps_s']:.1f}"])
    return report.aligned(head, lines)


def write_csv(rows: list[dict], path: str) -> None:
    seeds.write_csv(rows, path, CSV_FIELDS)


def write_combined(paths: list[str], out: str) -> int:
    """Combines per-seed LM sweeps (folders or accuracy.json files) into <out>/accuracy.{csv,json,png} and
    <out>/val_curves.png (first seed's curves; bars from the lowest to the highest seed's bpb) and prints the table.
    Returns 1 when a compressor has no successful run, else 0."""
    sweeps = [seeds.load(p) for p in paths]
    rows = combine(sweeps)
    os.makedirs(out, exist_ok=True)
    meta = sweeps[0]["meta"]
    used = sorted({s["meta"]["seed"] for s in sweeps})
    print(f"\ncombined {len(sweeps)} sweep(s), seeds {','.join(map(str, used))}: Δ is each seed's validation bpb "
          "minus that seed's dense run, in % of dense, averaged (± its standard error)")
    print(table(rows))
    csv_path, png_path = os.path.join(out, "accuracy.csv"), os.path.join(out, "accuracy.png")
    write_csv(rows, csv_path)
    with open(os.path.join(out, "accuracy.json"), "w") as f:
        json.dump({"combined_from": [s["path"] for s in sweeps], "meta": [s["meta"] for s in sweeps],
                   "rows": rows}, f, indent=1)
    plotted = [dict(r, val_bpb=r["val_bpb_mean"], bpb_range=(min(r["val_bpbs"]), max(r["val_bpbs"])))
               if r["status"] == "ok" else r for r in rows]
    drawn = report.plot(lm_report.write_png, plotted, png_path,
                        f"byte-level LM, {meta.get('layers')} layers d{meta.get('width')} ctx{meta.get('context')}, "
                        f"{meta['ranks']} ranks, {meta.get('steps')} steps, AdamW, gradients via {meta['comm']}; "
                        f"mean of seeds {','.join(map(str, used))} (bars: lowest to highest seed; curves: seed "
                        f"{used[0]})")
    print(f"\nwrote {csv_path}" + (f", {png_path}, {lm_report.curves_path(png_path)}" if drawn else ""))
    return 1 if any(r["status"] != "ok" for r in rows) else 0
