#!/usr/bin/env python3
"""The table of bench/peers/horovod.sh from its results.jsonl: per (model, link) one row per framework and
compression with s/step, samples/s, the ratio of gradcomp's throughput to Horovod's at the same compression (none,
fp16), and each run's throughput as a fraction of the same run on the unshaped link ("none"). With `--repeat N` the
k-th run of a row is compared with the k-th run of its peer (the same round), not with the last one.

    python3 bench/peers/peer_table.py RESULTS.jsonl
"""
import json
import sys


def same_round(runs, k):
    """The k-th of `runs` (its round), or the last one when it has fewer (a row run once beside repeated ones)."""
    if not runs:
        return None
    return runs[min(k, len(runs) - 1)]


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    rows = [json.loads(line) for line in open(argv[1]) if line.startswith("{")]
    # Runs of one (model, link, framework, compression) in file order: the k-th is round k.
    runs = {}
    for r in rows:
        runs.setdefault((r["model"], r["label"], r["framework"], r["compression"]), []).append(r)
    seen = {}
    print("| model | link | framework | compression | s/step | samples/s | vs Horovod, same compression | "
          "vs unshaped |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        key = (r["model"], r["label"], r["framework"], r["compression"])
        k = seen.get(key, 0)
        seen[key] = k + 1
        peer = same_round(runs.get((r["model"], r["label"], "horovod", r["compression"])), k)
        vs_hvd = f"{r['samples_per_s'] / peer['samples_per_s']:.2f}x" \
            if peer and r["framework"] == "gradcomp" else "–"
        base = same_round(runs.get((r["model"], "none", r["framework"], r["compression"])), k)
        vs_link = f"{r['samples_per_s'] / base['samples_per_s']:.2f}" if base and r["label"] != "none" else "–"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {r['s_per_step']:.3f} | {r['samples_per_s']:.2f} | "
              f"{vs_hvd} | {vs_link} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
