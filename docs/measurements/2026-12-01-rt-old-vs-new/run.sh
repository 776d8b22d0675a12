#!/usr/bin/env bash
# compressors_bench before the one-path change (fcecece) and now, interleaved, each run under SCHED_FIFO priority 50
# (chrt) so other jobs on the 2-core VM cannot take its cores mid-run. usage: run.sh OLD_BUILD NEW_BUILD OUT_DIR [N]
set -euo pipefail
old=$1 new=$2 out=$3 n=${4:-3}
mkdir -p "$out"
for i in $(seq 1 "$n"); do
  for side in old new; do
    b=$old; [ $side = new ] && b=$new
    { uptime; chrt -f 50 "$b/bench/kernels/compressors_bench"; } >"$out/$side-$i.txt" 2>&1
  done
done
