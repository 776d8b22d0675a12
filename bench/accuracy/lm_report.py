"""Outputs of `run.py --task lm` from the per-run results: the console table, accuracy.csv, accuracy.json,
accuracy.png (validation bits per byte vs compression ratio, and the training-loss curves) and val_curves.png
(validation bits per byte against the step). Same function names as report.py, so run.py picks one module."""
from __future__ import annotations

import csv
import os
import textwrap

import report
from report import codec, human_bytes, write_json  # noqa: F401  (write_json is part of this module's interface)

CSV_FIELDS = ("spec", "codec_spec", "status", "comm", "model", "params", "ranks", "steps", "global_batch",
              "tokens_per_step", "lr", "weight_decay", "warmup", "compression_ratio", "payload_bytes_per_step",
              "wire_bytes_per_step", "raw_bytes_per_step", "val_bpb", "delta_pct", "time_per_100_steps_s", "train_s",
              "time_to_dense_loss_s", "error")


def annotate(rows: list[dict]) -> None:
    """Adds delta_pct: 100 * (val_bpb - dense val_bpb) / dense val_bpb (positive = worse than dense; the same
    percentage of the validation loss in nats), and time_to_dense_loss_s: the training seconds until the row's first
    validation at or below dense's final val_bpb (None if never; the resolution is --evals). Both None without a
    successful 'none' row."""
    dense = report.dense_of(rows)
    for r in rows:
        if r.get("status") != "ok":
            continue
        r["delta_pct"] = None if dense is None else 100.0 * (r["val_bpb"] - dense["val_bpb"]) / dense["val_bpb"]
        r["time_to_dense_loss_s"] = None
        if dense is not None:
            reached = [e["train_s"] for e in r.get("evals", []) if e["bpb"] <= dense["val_bpb"] + 1e-12]
            r["time_to_dense_loss_s"] = reached[0] if reached else None


def table(rows: list[dict], with_link: bool = False) -> str:
    """The final table as aligned text (failures included with their error); `with_link` (run.py --link) adds the
    training time to dense's final validation loss ("never" where not reached)."""
    head = ["compressor", "ratio", "payload/step/rank", "wire/step/rank", "val bpb", "Δ vs none", "s/100 steps"]
    head += ["time to dense loss"] if with_link else []
    lines = []
    for r in rows:
        if r.get("status") != "ok":
            lines.append([r["spec"], "FAILED", r.get("error", "")[:70]])
            continue
        wire = r.get("wire_bytes_per_step")
        lines.append([r["spec"], f"{r['compression_ratio']:.1f}x", human_bytes(r["payload_bytes_per_step"]),
                      "n/a" if wire is None else human_bytes(wire), f"{r['val_bpb']:.4f}",
                      "n/a" if r.get("delta_pct") is None else f"{r['delta_pct']:+.2f}%",
                      f"{r['time_per_100_steps_s']:.1f}"])
        if with_link:
            t = r.get("time_to_dense_loss_s")
            lines[-1].append("never" if t is None else f"{t:.0f} s")
    return report.aligned(head, lines)


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def curves_path(png_path: str) -> str:
    """Where write_png puts the validation curves next to `png_path`: <folder>/val_curves.png."""
    return os.path.join(os.path.dirname(png_path) or ".", "val_curves.png")


def write_png(rows: list[dict], path: str, title: str) -> None:
    """`path`: left, validation bpb vs compression ratio (log x; a bar over 'bpb_range' when seeds were combined,
    dense as a dashed line); right, the training-loss curves (bits per byte, mean over ranks). Next to it,
    val_curves.png: validation bpb against the step, one line per compressor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    ok = [r for r in rows if r.get("status") == "ok"]
    palette = 10 if len(ok) <= 10 else 20
    cmap = plt.get_cmap(f"tab{palette}")
    title = textwrap.fill(title, 140)
    dense = report.dense_of(rows)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.2))
    for i, r in enumerate(ok):
        color = cmap(i % palette)
        ax.scatter([r["compression_ratio"]], [r["val_bpb"]], color=color, s=40, zorder=3)
        if "bpb_range" in r:
            ax.vlines(r["compression_ratio"], *r["bpb_range"], color=color, linewidth=1.5, zorder=2)
        ax.annotate(r["spec"], (r["compression_ratio"], r["val_bpb"]), textcoords="offset points",
                    xytext=(5, 4 if i % 2 == 0 else -11), fontsize=8, color=color)
        if r.get("loss_curve"):
            steps, losses = zip(*r["loss_curve"])
            bx.plot(steps, losses, color=color, label=r["spec"], linewidth=1.2)
    if dense is not None:
        ax.axhline(dense["val_bpb"], color="gray", linestyle="--", linewidth=1, label="dense (none)")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    if ok:
        ax.set_xlim(min(r["compression_ratio"] for r in ok) / 1.6, max(r["compression_ratio"] for r in ok) * 3.0)
    ax.set_xlabel("compression ratio (f32 gradient bytes / payload bytes), log scale")
    ax.set_ylabel("validation bits per byte (lower is better)")
    ax.set_title("validation loss vs compression")
    ax.grid(True, which="both", alpha=0.3)
    bx.set_xlabel("step")
    bx.set_ylabel("training loss, bits per byte (mean over ranks)")
    bx.set_title("training-loss curves")
    bx.grid(True, alpha=0.3)
    if ok:
        bx.legend(fontsize=8)
    report.save_figure(fig, path, title)

    fig, cx = plt.subplots(figsize=(8, 5.2))
    for i, r in enumerate(ok):
        evals = r.get("evals") or []
        if evals:
            cx.plot([e["step"] for e in evals], [e["bpb"] for e in evals], marker="o", markersize=3,
                    color=cmap(i % palette), label=r["spec"], linewidth=1.2)
    cx.set_xlabel("step")
    cx.set_ylabel("validation bits per byte")
    cx.set_title("validation-loss curves")
    cx.grid(True, alpha=0.3)
    if ok:
        cx.legend(fontsize=8)
    # This figure is 8 inches wide: the 140-column title of the wide one would be cut at both sides.
    report.save_figure(fig, curves_path(path), textwrap.fill(title.replace("\n", " "), 100), title_size=9)

