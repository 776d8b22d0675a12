#!/usr/bin/env bash
# CTest check of cluster.sh (label mpi): 2 emulated hosts x 2 ranks at 1 Gbit/s. The ranks must land two per host in
# two distinct network namespaces, a hierarchical allreduce across them must be right on every rank (allreduce_perf
# exits 1 on any wrong element or ranks that disagree), and no namespace may be left behind. Exit 77 (skipped)
# without root, ip or tc.  usage: cluster_smoke.sh ALLREDUCE_PERF
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
perf=${1:?usage: cluster_smoke.sh ALLREDUCE_PERF}
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "cluster_smoke: needs root, ip and tc: skipped"; exit 77
fi
before=$(ip netns list | grep -o "gc-[a-z0-9]*-[0-9]*" | sort)

where=$("$here/cluster.sh" 2 2 --link 1gbit -- \
  sh -c 'echo "rank=$OMPI_COMM_WORLD_RANK host=$GRADCOMP_CLUSTER_HOST netns=$(readlink /proc/self/ns/net)"' 2>&1)
echo "$where"
for r in 0 1; do echo "$where" | grep -q "rank=$r host=0 " || { echo "FAIL: rank $r not on host 0"; exit 1; }; done
for r in 2 3; do echo "$where" | grep -q "rank=$r host=1 " || { echo "FAIL: rank $r not on host 1"; exit 1; }; done
spaces=$(echo "$where" | grep -o "netns=net:\[[0-9]*\]" | sort -u | wc -l)
[ "$spaces" -eq 2 ] || { echo "FAIL: the 4 ranks ran in $spaces network namespaces, expected 2"; exit 1; }

"$here/cluster.sh" 2 2 --link 1gbit -- "$perf" --hierarchical --min-bytes 64K --max-bytes 1M --factor 16 --iters 1 \
  --specs "fp16;topk:ratio=0.01" || { echo "FAIL: hierarchical allreduce across the emulated hosts"; exit 1; }

after=$(ip netns list | grep -o "gc-[a-z0-9]*-[0-9]*" | sort)
if [ "$before" != "$after" ]; then  # other cluster runs may be going on: compare, don't require none
  echo "FAIL: cluster.sh left namespaces behind"; ip netns list; exit 1
fi
echo "cluster_smoke: ok"
