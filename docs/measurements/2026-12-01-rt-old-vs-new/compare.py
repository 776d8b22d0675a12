#!/usr/bin/env python3
"""Medians over the runs of run.sh: best ms and fraction of memcpy per (codec, threads), old vs new."""
import glob, statistics as st, sys
from collections import defaultdict
d = defaultdict(lambda: defaultdict(list))
for side in ("old", "new"):
    for f in sorted(glob.glob(f"{sys.argv[1] if len(sys.argv) > 1 else '.'}/{side}-*.txt")):
        for line in open(f):
            c = [x.strip() for x in line.split("|")]
            if len(c) > 11 and c[1] not in ("codec", "---") and c[3].isdigit():
                d[(c[1], int(c[3]))][side].append((float(c[6]), float(c[10])))
print("| codec | threads | old ms (median) | new ms (median) | new/old speed | old fraction | new fraction |")
print("|---|---|---|---|---|---|---|")
for key in sorted(d):
    o, n = d[key]["old"], d[key]["new"]
    if not o or not n:
        continue
    om, nm = st.median(x[0] for x in o), st.median(x[0] for x in n)
    print(f"| {key[0]} | {key[1]} | {om:.1f} | {nm:.1f} | {om / nm:.2f} | {st.median(x[1] for x in o):.2f} | "
          f"{st.median(x[1] for x in n):.2f} |")
