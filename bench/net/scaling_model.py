#!/usr/bin/env python3
"""An alpha-beta cost model of gradcomp's collective algorithms, fitted to emulated-cluster measurements
(bench/net/cluster.sh + allreduce_perf --json), then used to predict the communication time of one step for 8 to
1,024 GPUs in nodes of 8 at 100/200/400 Gbit/s per node, for ResNet-50 and a 1.3B-parameter transformer, and the
compression ratio at which each compressed algorithm stops paying off against the dense ring.

    python3 bench/net/scaling_model.py --fit docs/measurements/2026-12-01-cluster/allreduce-1gbit.jsonl \\
        --out docs/measurements/2026-12-01-scaling

The model (docs/scaling.md has the derivation): a message costs alpha + bytes / B, where B is the slower link it
crosses. With p ranks, k per node, N = p / k nodes, n gradient bytes, s = n / ratio payload bytes:
  dense ring          2(p-1) alpha + 2(p-1)/p n / B_inter
  allgather           (p-1) alpha + (p-1) s / B_inter                      (every payload reaches every rank)
  sparse + switch     min(allgather, dense ring on n) + ceil(log2 p) alpha (the sizes' allgather decides)
  SRA (requantized)   2(p-1) alpha + 2(p-1)/p s / B_inter                  (a ring allreduce of compressed chunks)
  hierarchical X      2(k-1)/k n / B_intra + 2(k-1) alpha_intra + X over N nodes with the node's n
plus the codec's compute: compress + decompress passes over n at the codec's throughput (the fit measures the CPU's;
the GPU prediction takes --gpu-codec-gbps, an assumption until bench/gpu/check.sh has measured it).
"""
import argparse
import json
import math
import os
import sys

# Bytes on the wire per gradient byte for each codec's payload (f32 gradients), from gradcomp's payload formats:
# fp16 2 bytes/value; qsgd 4-bit 4 bits + a f32 scale per 512; topk / dgc 1% / 0.1% as (u32 index, f32 value).
RATIOS = {"fp16": 2.0, "qsgd:bits=4": 32 / (4 + 32 / 512), "topk:ratio=0.01": 1 / (0.01 * 2),
          "dgc:ratio=0.001": 1 / (0.001 * 2)}
ALGORITHM = {"fp16": "dense", "qsgd:bits=4": "sra", "topk:ratio=0.01": "sparse", "dgc:ratio=0.001": "sparse"}
MODELS = {"resnet50": 25.6e6 * 4, "transformer-1.3b": 1.3e9 * 4}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", required=True, help="allreduce_perf --json output of cluster.sh runs ('### H R' headers)")
    p.add_argument("--out", required=True, help="folder for fit.json, predictions.md and the PNG plots")
    p.add_argument("--gpu-codec-gbps", type=float, default=1000.0,
                   help="assumed GPU codec throughput, GB/s of gradient per pass (default 1000; unmeasured)")
    p.add_argument("--intra-gbps", type=float, default=300.0, help="assumed intra-node bandwidth, GB/s (NVLink)")
    p.add_argument("--gpu-alpha-us", type=float, default=10.0, help="assumed per-message latency across nodes, us")
    return p.parse_args(argv)


def read_runs(path):
    """[(hosts, ranks_per_host, hierarchical, row)] from the file's '### H R [--hierarchical]' sections."""
    runs, topo = [], None
    for line in open(path):
        line = line.strip()
        if line.startswith("###"):
            parts = line.split()
            topo = (int(parts[1]), int(parts[2]), "--hierarchical" in parts)
        elif line.startswith("{") and topo:
            run = topo + (json.loads(line),)
            if run not in runs:  # allreduce_perf repeats the dense baseline at the head of every table
                runs.append(run)
    return runs


def least_squares(xs, ys):
    """(a, b) minimizing sum (a * x0 + b * x1 - y)^2 over rows x = (x0, x1), both clamped at >= 0."""
    s00 = sum(x[0] * x[0] for x in xs)
    s01 = sum(x[0] * x[1] for x in xs)
    s11 = sum(x[1] * x[1] for x in xs)
    t0 = sum(x[0] * y for x, y in zip(xs, ys))
    t1 = sum(x[1] * y for x, y in zip(xs, ys))
    det = s00 * s11 - s01 * s01
    if abs(det) < 1e-30:
        return 0.0, t1 / s11
    a, b = (t0 * s11 - t1 * s01) / det, (s00 * t1 - s01 * t0) / det
    if a < 0:
        a, b = 0.0, t1 / s11
    return a, max(b, 1e-15)


def fit(runs):
    """alpha (s), inverse bandwidth (s/byte) across hosts from the flat dense rows, and the CPU codec cost per byte
    from the compressed rows' compress + decompress times."""
    xs, ys = [], []
    for hosts, per, hier, row in runs:
        p = row["ranks"]
        if not hier and row["spec"] == "none" and per == 1:
            xs.append((2 * (p - 1), 2 * (p - 1) / p * row["bytes"]))
            ys.append(row["time_s"])
    alpha, inv_b = least_squares(xs, ys)
    codec = {}
    for hosts, per, hier, row in runs:
        if not hier and row["spec"] in RATIOS and row["bytes"] >= 1 << 20:
            codec.setdefault(row["spec"], []).append((row["compress_s"] + row["decompress_s"]) / row["bytes"])
    codec = {k: sorted(v)[len(v) // 2] for k, v in codec.items()}
    residuals = [abs(alpha * x[0] + inv_b * x[1] - y) / y for x, y in zip(xs, ys)]
    # Out-of-sample check: the compressed flat rows on one rank per host, predicted from the fit and their own
    # measured codec times.
    checks = []
    for hosts, per, hier, row in runs:
        if not hier and per == 1 and row["spec"] in RATIOS:
            p, n = row["ranks"], row["bytes"]
            predicted = row["compress_s"] + row["decompress_s"] + comm_time(
                ALGORITHM[row["spec"]], p, n, n / RATIOS[row["spec"]], alpha, 1 / inv_b)
            checks.append({"spec": row["spec"], "bytes": n, "measured_s": row["time_s"],
                           "predicted_s": round(predicted, 6)})
    return {"alpha_s": alpha, "bandwidth_Bps": 1 / inv_b, "codec_s_per_byte_cpu": codec, "points": len(xs),
            "median_relative_error": sorted(residuals)[len(residuals) // 2] if residuals else None,
            "compressed_rows_predicted": checks}


def comm_time(algorithm, p, n, s, alpha, bw):
    if p <= 1:
        return 0.0
    dense = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw
    if algorithm == "dense":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * s / bw
    if algorithm == "allgather":
        return (p - 1) * alpha + (p - 1) * s / bw
    if algorithm == "sparse":
        return min((p - 1) * alpha + (p - 1) * s / bw, dense) + math.ceil(math.log2(p)) * alpha
    if algorithm == "sra":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * s / bw
    if algorithm == "ring":
        return dense
    raise ValueError(algorithm)


def step_time(spec, gpus, n, gbit, args, hierarchical=False):
    """Predicted communication + codec time of one step's gradients (n bytes) on `gpus` GPUs in nodes of 8."""
    k = min(8, gpus)
    nodes = max(1, gpus // k)
    bw = gbit * 1e9 / 8
    alpha = args.gpu_alpha_us * 1e-6
    intra = 2 * (k - 1) / k * n / (args.intra_gbps * 1e9) + 2 * (k - 1) * 2e-6
    if spec == "none":
        flat = comm_time("ring", gpus, n, n, alpha, bw / k)  # k ranks share the node's link in a flat ring
        return intra + comm_time("ring", nodes, n, n, alpha, bw) if hierarchical else flat
    ratio, algorithm = RATIOS[spec], ALGORITHM[spec]
    codec = 2 * n / (args.gpu_codec_gbps * 1e9)
    if hierarchical:
        return intra + codec + comm_time(algorithm, nodes, n, n / ratio, alpha, bw)
    return codec + comm_time(algorithm, gpus, n, n / ratio, alpha, bw / k)


def break_even_ratio(algorithm, gpus, n, gbit, args):
    """The smallest compression ratio at which `algorithm` (flat) beats the flat dense ring, codec cost included;
    inf when none up to 1e6 does."""
    k = min(8, gpus)
    bw, alpha = gbit * 1e9 / 8 / k, args.gpu_alpha_us * 1e-6
    dense = comm_time("ring", gpus, n, n, alpha, bw)
    codec = 2 * n / (args.gpu_codec_gbps * 1e9)
    lo, hi = 1.0, 1e6
    if codec + comm_time(algorithm, gpus, n, n / hi, alpha, bw) >= dense:
        return math.inf
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if codec + comm_time(algorithm, gpus, n, n / mid, alpha, bw) < dense:
            hi = mid
        else:
            lo = mid
    return hi


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    fitted = fit(read_runs(args.fit))
    with open(os.path.join(args.out, "fit.json"), "w") as f:
        json.dump(fitted, f, indent=2)
    print(f"fit: alpha {fitted['alpha_s'] * 1e6:.0f} us, bandwidth {fitted['bandwidth_Bps'] * 8 / 1e9:.3f} Gbit/s "
          f"({fitted['points']} points, median relative error {fitted['median_relative_error']})")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus_list = [8, 16, 32, 64, 128, 256, 512, 1024]
    specs = ["none"] + list(RATIOS)
    lines = ["| model | Gbit/s per node | GPUs | " + " | ".join(specs) + " | hierarchical none | hierarchical topk 1% |",
             "|---|---|---|" + "---|" * (len(specs) + 2)]
    for model, n in MODELS.items():
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
        for ax, gbit in zip(axes, (100, 200, 400)):
            for spec in specs:
                ax.plot(gpus_list, [step_time(spec, g, n, gbit, args) * 1e3 for g in gpus_list], marker="o",
                        label=spec)
            ax.plot(gpus_list, [step_time("topk:ratio=0.01", g, n, gbit, args, True) * 1e3 for g in gpus_list],
                    "--", label="topk 1%, hierarchical")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{model}, {gbit} Gbit/s per node")
            ax.set_xlabel("GPUs (nodes of 8)")
            ax.grid(True, which="both", alpha=0.3)
            for g in (8, 64, 1024):
                row = [step_time(spec, g, n, gbit, args) * 1e3 for spec in specs]
                row += [step_time("none", g, n, gbit, args, True) * 1e3,
                        step_time("topk:ratio=0.01", g, n, gbit, args, True) * 1e3]
                lines.append(f"| {model} | {gbit} | {g} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
        axes[0].set_ylabel("predicted ms per step (communication + codec)")
        axes[-1].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, f"scaling-{model}.png"), dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algorithm in ("dense", "allgather", "sra"):
        for gbit in (100, 400):
            ax.plot(gpus_list, [break_even_ratio(algorithm, g, MODELS["resnet50"], gbit, args) for g in gpus_list],
                    marker="o", label=f"{algorithm}, {gbit} Gbit/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (nodes of 8)")
    ax.set_ylabel("compression ratio needed to beat the dense ring")
    ax.set_title("ResNet-50: where compression starts to pay off")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "break-even.png"), dpi=110)
    plt.close(fig)
    lines.append("")
    lines.append("| algorithm | Gbit/s | " + " | ".join(f"{g} GPUs" for g in gpus_list) + " |")
    lines.append("|---|---|" + "---|" * len(gpus_list))
    for algorithm in ("dense", "allgather", "sra"):
        for gbit in (100, 200, 400):
            vals = [break_even_ratio(algorithm, g, MODELS["resnet50"], gbit, args) for g in gpus_list]
            lines.append(f"| {algorithm} | {gbit} | " + " | ".join("never" if math.isinf(v) else f"{v:.1f}x"
                                                                   for v in vals) + " |")
    with open(os.path.join(args.out, "predictions.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
