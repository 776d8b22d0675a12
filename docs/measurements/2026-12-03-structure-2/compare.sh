#!/usr/bin/env bash
# Before (82e68b0, the previous landing: /work/wt/before/build) vs after (this session's merged tree:
# /work/main/build), alternated, on the idle 2-core VM: compressors_bench (1 thread) and hooks_bench on a 1 Gbit/s
# shaped loopback, 4 ranks. Both builds: Release, CUDA on, bench on, the same flags.
set -u
OUT=$(cd "$(dirname "$0")" && pwd)
AFTER_ROOT=/work/main
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
ROWS=floor:compute,torch:allreduce,gradcomp:topk:ratio=0.01,gradcomp:dgc,gradcomp:fp16,optimizer:topk:ratio=0.01,optimizer:fp16
for round in ${ROUNDS:-1 2}; do
  for which in before after; do
    if [ $which = before ]; then B=/work/wt/before/build; else B=$AFTER_ROOT/build; fi
    echo "$(date -u +%FT%TZ) round $round $which: $(uptime)" >> $OUT/uptime.txt
    timeout 900 $B/bench/kernels/compressors_bench --benchmark_filter='threads:1/' > $OUT/compressors-$which-$round.txt 2>&1
    (cd $AFTER_ROOT && PYTHONPATH=$B/python timeout 900 bench/net/shaped.sh 1gbit -- mpirun --allow-run-as-root \
      --oversubscribe -np 4 -x PYTHONPATH -x OMP_NUM_THREADS .venv/bin/python bench/torch/hooks_bench.py --json \
      --rows $ROWS) > $OUT/hooks-$which-$round.jsonl 2>&1
  done
done
echo "$(date -u +%FT%TZ) done: $(uptime)" >> $OUT/uptime.txt
