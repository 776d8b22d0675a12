#!/usr/bin/env bash
# Issue 33's "before and after in one run" for the Horovod peer script: gradcomp before the structure changes
# (34ff8d9, the main the review was made on: /work/wt-before/build) and after (/work/main/build), alternated, beside
# Horovod's rows, on the shared 1 Gbit/s loopback (bench/net/shaped.sh), 4 ranks, on the idle 2-core VM.
# MLP: 8 timed steps after 2 warm-up; AlexNet: 3 after 1 (as docs/fusion.md's rows).
set -u
# Results go beside this script, or into $OUT when it is set (a later run of the same comparison).
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
ROOT=/work/main
cd "$ROOT"
peer() {  # which round model steps warmup rows
  local which=$1 round=$2 model=$3 steps=$4 warmup=$5 rows=$6 pp=
  case $which in before) pp=/work/wt-before/build/python ;; after) pp=$ROOT/build/python ;; esac
  echo "$(date -u +%FT%TZ) round $round $which $model: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/uptime.txt"
  PYTHONPATH=$pp bench/peers/horovod.sh --links 1gbit --models "$model" --steps "$steps" --warmup "$warmup" \
    --rows "$rows" --out "$OUT/$model-$which-$round" > /dev/null 2>&1
}
for round in ${ROUNDS:-1 2}; do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"
  for spec in "mlp 8 2" "alexnet 3 1"; do
    set -- $spec
    for which in $order; do peer $which $round $1 $2 $3 gradcomp:none,gradcomp:fp16; done
    peer horovod $round $1 $2 $3 horovod:none,horovod:fp16
  done
done
echo "$(date -u +%FT%TZ) done: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/uptime.txt"
