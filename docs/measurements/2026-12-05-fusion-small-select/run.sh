#!/usr/bin/env bash
# The fusion table of docs/fusion.md: 4 MPI ranks on the 10 Gbit/s loopback, two runs of each workload, the load
# average before and after each. Run from the repository root on an otherwise idle machine, after scripts/test.sh.
set -euo pipefail
out=$(dirname "$0")
run() {  # run <file> <fusion_bench args...>
  local file=$out/$1; shift
  { echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# fusion_bench $*"
    bench/net/shaped.sh 10gbit -- mpirun --allow-run-as-root --oversubscribe -np 4 build/bench/comm/fusion_bench "$@"
    echo "# done $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; } >>"$file" 2>&1
}
specs=(--spec none --spec fp16 --spec topk:ratio=0.01)
for round in 1 2; do
  run small.txt --workload small "${specs[@]}" --steps 10 --breakdown
  run resnet50.txt --workload resnet50 "${specs[@]}" --steps 5 --breakdown
  run resnet50-4mib.txt --workload resnet50 "${specs[@]}" --steps 5 --threshold 4194304
done
