#!/bin/bash
# join's cost per DistributedOptimizer step, before (control round per step) and after (notes), alternated:
# bench/torch/join_cost_bench.py on the mpi, torch and runtime backends at 2 and 4 ranks on loopback, three rounds
# (each reverses the order of the one before); 1000 timed steps on mpi and runtime, 300 on torch (a slower step).
# BEFORE: a python/ folder holding the package of the commit before (e.g. `git archive e73f48f python/gradcomp |
# tar -x -C /tmp/before` plus this build's _gradcomp module, whose C++ only adds the Mailbox); AFTER: this build's
# python folder. Results: $OUT/results.jsonl, one line per row; summary.py makes the table.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-docs/measurements/2026-12-07-join-notes}
BEFORE=${BEFORE:-/tmp/before/python}
AFTER=${AFTER:-$PWD/build/python}
: >"$OUT/results.jsonl"
uptime >"$OUT/uptime.txt"
for round in 1 2 3; do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"
  for backend in mpi torch runtime; do
    steps=1000; [ "$backend" = torch ] && steps=300
    for np in 2 4; do
      for which in $order; do
        path=$BEFORE; [ "$which" = after ] && path=$AFTER
        GRADCOMP_BACKEND=$backend PYTHONPATH=$path timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$np" \
          -x PYTHONPATH -x GRADCOMP_BACKEND .venv/bin/python bench/torch/join_cost_bench.py --steps "$steps" --label "$which-$round" \
          | grep '^{' >>"$OUT/results.jsonl"
      done
    done
  done
  uptime >>"$OUT/uptime.txt"
done
