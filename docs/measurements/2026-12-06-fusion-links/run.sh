#!/usr/bin/env bash
# Issue 35's fusion table on two emulated networks, alternated, two rounds: 4 MPI ranks behind one shared 10 Gbit/s
# loopback (bench/net/shaped.sh: the ranks share its rate) and 4 emulated hosts of one rank, each with its own
# 10 Gbit/s uplink (bench/net/cluster.sh 4 1). Run from the repository root on an otherwise idle machine, after
# scripts/test.sh; the load average is written before and after each run.
set -euo pipefail
# Output goes beside this script, or into $OUT when it is set (a later run of the same table).
out=${OUT:-$(dirname "$0")}
mkdir -p "$out"
bench=$PWD/build/bench/comm/fusion_bench
run() {  # run <file> <network> <fusion_bench args...>
  local file=$out/$1 net=$2; shift 2
  { echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $net: fusion_bench $*"
    if [ "$net" = shared ]; then
      bench/net/shaped.sh 10gbit -- mpirun --allow-run-as-root --oversubscribe -np 4 "$bench" "$@"
    else
      bench/net/cluster.sh 4 1 --link 10gbit --timeout 900 -- "$bench" "$@"
    fi
    echo "# done $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; } >>"$file" 2>&1
}
specs=(--spec none --spec fp16 --spec topk:ratio=0.01)
for round in 1 2; do
  for net in shared hosts; do
    run "small-$net.txt" "$net" --workload small "${specs[@]}" --steps 10 --breakdown
    run "resnet50-$net.txt" "$net" --workload resnet50 "${specs[@]}" --steps 5 --breakdown
  done
done
