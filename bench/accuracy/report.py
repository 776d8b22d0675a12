"""The benchmark's outputs from the per-run results: the console table, accuracy.csv, accuracy.png, accuracy.json."""
from __future__ import annotations

import csv
import json
import math
import os
import sys

CSV_FIELDS = ("spec", "codec_spec", "status", "comm", "model", "ranks", "epochs", "train_images", "global_batch",
              "steps", "lr", "optimizer_momentum",
              "compression_ratio", "payload_bytes_per_step", "wire_bytes_per_step", "raw_bytes_per_step", "test_acc", "delta_pp",
              "test_loss", "time_per_epoch_s", "train_s", "time_to_dense_acc_s", "link", "error")


def codec(spec: str) -> str:
    return spec.split(":", 1)[0]


def dense_of(rows: list[dict]) -> dict | None:
    """The uncompressed baseline: the first successful run of codec 'none'."""
    return next((r for r in rows if r.get("status") == "ok" and codec(r["spec"]) == "none"), None)


def annotate(rows: list[dict]) -> None:
    """Adds delta_pp (test accuracy minus the dense run's, in percentage points) and time_to_dense_acc_s (training
    seconds until the first evaluation at or above the dense run's final accuracy; None if never reached)."""
    dense = dense_of(rows)
    for r in rows:
        if r.get("status") != "ok":
            continue
        r["delta_pp"] = None if dense is None else 100.0 * (r["test_acc"] - dense["test_acc"])
        r["time_to_dense_acc_s"] = None
        if dense is not None:
            for e in r.get("evals", []):
                if e["acc"] >= dense["test_acc"] - 1e-12:
                    r["time_to_dense_acc_s"] = e["train_s"]
                    break


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000.0
    return f"{n:.2f} GB"


def _fmt(v, spec: str, missing: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return missing
    return format(v, spec)


def table(rows: list[dict], with_link: bool) -> str:
    """The final table as aligned text (one row per compressor, failures included with their error)."""
    head = ["compressor", "ratio", "payload/step/rank", "wire/step/rank", "test acc", "Δ vs none", "s/epoch"]
    if with_link:
        head.append("time to dense acc")
    lines = []
    for r in rows:
        if r.get("status") != "ok":
            lines.append([r["spec"], "FAILED", r.get("error", "")[:70]])
            continue
        wire = r.get("wire_bytes_per_step")
        line = [r["spec"], _fmt(r["compression_ratio"], ".1f") + "x", human_bytes(r["payload_bytes_per_step"]),
                "n/a" if wire is None else human_bytes(wire),
                _fmt(100 * r["test_acc"], ".2f") + "%",
                "n/a" if r.get("delta_pp") is None else f"{r['delta_pp']:+.2f} pp",
                _fmt(r["time_per_epoch_s"], ".1f")]
        if with_link:
            t = r.get("time_to_dense_acc_s")
            line.append("not reached" if t is None else f"{t:.1f} s")
        lines.append(line)
    return aligned(head, lines)


def aligned(head: list[str], lines: list[list]) -> str:
    """A text table: the first column left-aligned, the others right-aligned, a dashed rule under the header. A line
    of three items instead of len(head) is a failed row, printed as 'name  FAILED: error'."""
    widths = [max(len(str(x[i])) for x in [head] + [l for l in lines if len(l) == len(head)])
              for i in range(len(head))]
    out = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for l in lines:
        if len(l) != len(head):
            out.append(f"{l[0].ljust(widths[0])}  {l[1]}: {l[2]}")
        else:
            out.append("  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)
                                 for i, (x, w) in enumerate(zip(l, widths))))
    return "\n".join(out)


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def write_json(rows: list[dict], meta: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "runs": rows}, f, indent=1)


# Accuracy points further than this under dense are drawn on the plot's bottom edge (see write_png).
OFF_SCALE_PP = 10.0


def save_figure(fig, path: str, title: str, title_size: int = 10) -> None:
    """Titles, lays out and writes `fig` to `path` atomically (a .tmp.png renamed), then closes it."""
    import matplotlib.pyplot as plt
    fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def plot(write_png, rows: list[dict], path: str, title: str) -> bool:
    """write_png(rows, path, title), or, when matplotlib is not installed, a warning on stderr that names it and how
    to get it, and False: the table, CSV and JSON are written before the plot, so a sweep never loses its results
    (or its next seed) to a missing plotting library. Other errors propagate."""
    try:
        write_png(rows, path, title)
        return True
    except ImportError as e:
        if (e.name or "").split(".")[0] != "matplotlib":
            raise
        print(f"accuracy: no plot {path}: matplotlib is not installed for {sys.executable} (pip install matplotlib, "
              "or Debian's python3-matplotlib; or run run.py with a python that has it). The CSV and JSON are "
              "written.", file=sys.stderr)
        return False


def write_png(rows: list[dict], path: str, title: str) -> None:
    """Left: test accuracy vs compression ratio (log x), one labelled point per compressor (with a vertical bar for a
    row that has 'acc_range', the seeds' spread), the dense accuracy as a dashed line. Right: the training-loss
    curves (mean over ranks) against the step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.2))
    cmap = plt.get_cmap("tab10")
    dense = dense_of(rows)
    # A diverged run (10%) would squeeze every other point into one line: rows more than OFF_SCALE_PP under dense
    # are drawn as a triangle on the bottom edge, labelled with their accuracy.
    near = [r for r in ok if dense is None or 100 * r["test_acc"] >= 100 * dense["test_acc"] - OFF_SCALE_PP]
    floor = None
    if dense is not None and len(near) < len(ok):
        floor = min(100 * min(r["test_acc"], r.get("acc_range", (r["test_acc"],))[0]) for r in near)
        floor = max(floor, 100 * dense["test_acc"] - OFF_SCALE_PP) - 0.5
    by_ratio = sorted(range(len(ok)), key=lambda j: ok[j]["compression_ratio"])
    label_below = {j: k % 2 == 1 for k, j in enumerate(by_ratio)}  # neighbours on the x axis label on opposite sides
    for i, r in enumerate(ok):
        color = cmap(i % 10)
        acc = 100 * r["test_acc"]
        off = floor is not None and acc < floor
        y = floor if off else acc
        ax.scatter([r["compression_ratio"]], [y], color=color, s=40, zorder=3, marker="v" if off else "o",
                   clip_on=False)
        if "acc_range" in r and not off:  # combined seeds: the lowest to the highest seed's accuracy
            lo, hi = r["acc_range"]
            lo_y = 100 * lo if floor is None else max(100 * lo, floor)
            ax.vlines(r["compression_ratio"], lo_y, 100 * hi, color=color, linewidth=1.5, zorder=2)
        text = f"{r['spec']}: {acc:.1f}% (off scale)" if off else r["spec"]
        ax.annotate(text, (r["compression_ratio"], y), textcoords="offset points",
                    xytext=(5, 4 if off or not label_below[i] else -11), fontsize=8, color=color)
        steps, losses = zip(*r["loss_curve"]) if r["loss_curve"] else ((), ())
        bx.plot(steps, losses, color=color, label=r["spec"], linewidth=1.2)
    if dense is not None:
        ax.axhline(100 * dense["test_acc"], color="gray", linestyle="--", linewidth=1, label="dense (none)")
        ax.legend(loc="lower left", fontsize=8)
    if floor is not None:
        ax.set_ylim(bottom=floor)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("compression ratio (f32 gradient bytes / payload bytes), log scale")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("accuracy vs compression")
    ax.grid(True, which="both", alpha=0.3)
    if ok:
        lo = min(r["compression_ratio"] for r in ok)
        hi = max(r["compression_ratio"] for r in ok)
        ax.set_xlim(lo / 1.6, hi * 3.0)
    bx.set_xlabel("step")
    bx.set_yscale("log")
    bx.set_ylabel("training loss (mean over ranks), log scale")
    bx.set_title("loss curves")
    bx.grid(True, alpha=0.3)
    if ok:
        bx.legend(fontsize=8)
    save_figure(fig, path, title)
