#!/usr/bin/env bash
# Old (fcecece, before this session) vs new (HEAD) builds, alternated, on this idle 2-core VM.
set -u
OUT=/work/main/docs/measurements/2026-12-01-one-path
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for round in 1 2; do
  for which in old new; do
    if [ $which = old ]; then B=/tmp/gc-old/build; else B=/work/main/build-cpu; fi
    echo "$(date -u +%FT%TZ) round $round $which: $(uptime)" >> $OUT/uptime.txt
    timeout 900 $B/bench/kernels/compressors_bench --benchmark_filter='threads:1/' > $OUT/compressors-$which-$round.txt 2>&1
    timeout 900 $B/bench/comm/allreduce_perf --backend local --ranks 4 --bytes 100M --iters 3 \
      --specs "fp16;qsgd:bits=4;topk:ratio=0.01;dgc:ratio=0.001" > $OUT/allreduce-$which-$round.txt 2>&1
    timeout 900 mpirun --allow-run-as-root --oversubscribe -np 4 $B/bench/comm/fusion_bench --workload resnet50 \
      --spec none --spec topk:ratio=0.01 --steps 3 > $OUT/fusion-$which-$round.txt 2>&1
  done
done
echo "$(date -u +%FT%TZ) done: $(uptime)" >> $OUT/uptime.txt
