#!/usr/bin/env bash
# Issue 33: is the ~1% that the Horovod peer rows show after the structure changes in the communication layer? The
# dense allreduce of 100 MB (f32, `none` and fp16) on 4 MPI ranks behind the shared 1 Gbit/s loopback, gradcomp
# before (34ff8d9, built in /work/wt-before/build) and after (this checkout's build/), alternated, three rounds.
# Run from the repository root on an otherwise idle machine.
set -euo pipefail
out=$(dirname "$0")
for round in 1 2 3; do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"
  for which in $order; do
    bin=build/bench/comm/allreduce_perf; [ "$which" = before ] && bin=/work/wt-before/build/bench/comm/allreduce_perf
    { echo "# round $round $which $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
      bench/net/shaped.sh 1gbit -- mpirun --allow-run-as-root --oversubscribe -np 4 "$bin" --bytes 100000000 \
        --specs "none:nonfinite=raise;fp16" --algorithm dense --iters 3 --no-check; } >>"$out/$which.txt" 2>&1
  done
done
