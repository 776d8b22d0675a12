#!/usr/bin/env python3
"""The table of compare.sh's results.jsonl (run from this folder): one row per backend, ranks, compression and round."""
import collections
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1] if len(sys.argv) > 1 else "results.jsonl")]
pairs = collections.defaultdict(dict)
for r in rows:
    which, rnd = r["label"].split("-")
    pairs[(r["backend"], r["ranks"], r["compression"], rnd)][which] = r
print("| backend | ranks | compression | round | before ms/step | after ms/step | after / before | control rounds "
      "per step, before → after | control bytes per step | notes per step after |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(pairs):
    b, a = pairs[key]["before"], pairs[key]["after"]
    print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {b['step_ms']:.3f} | {a['step_ms']:.3f} | "
          f"{a['step_ms'] / b['step_ms']:.3f} | {b['control_rounds_per_step']:g} → {a['control_rounds_per_step']:g} | "
          f"{b['control_bytes_per_step']:g} → {a['control_bytes_per_step']:g} | {a['notes_per_step']:g} |")
