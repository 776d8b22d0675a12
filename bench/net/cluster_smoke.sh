#!/usr/bin/env bash
# CTest check of cluster.sh (label mpi): 2 emulated hosts x 2 ranks at 1 Gbit/s. The ranks must land two per host in
# two distinct network namespaces, a hierarchical allreduce across them must be right on every rank (allreduce_perf
# exits 1 on any wrong element or ranks that disagree; one codec of each class, each against its reference), and no
# namespace may be left behind. Each launch is bounded (--timeout), so a launch that cannot finish fails the test with
# what it printed instead of hanging it. Exit 77 (skipped) without root, ip or tc, when this kernel's bridge carries
# no traffic between the emulated hosts (cluster.sh exit 3; the network is printed) or when a trivial job (no
# gradcomp code) cannot run across them.  usage: cluster_smoke.sh ALLREDUCE_PERF
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
perf=${1:?usage: cluster_smoke.sh ALLREDUCE_PERF}
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "cluster_smoke: needs root, ip and tc: skipped"; exit 77
fi
before=$(ip netns list | grep -o "gc-[a-z0-9]*-[0-9]*" | sort)

log=$(mktemp); trap 'rm -f "$log"' EXIT
"$here/cluster.sh" 2 2 --link 1gbit --timeout 45 -- \
  sh -c 'echo "rank=$OMPI_COMM_WORLD_RANK host=$GRADCOMP_CLUSTER_HOST netns=$(readlink /proc/self/ns/net)"' 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 3 ]; then echo "cluster_smoke: the emulated hosts cannot reach each other here (above): skipped"; exit 77; fi
# This launch runs no gradcomp code (sh -c echo): if Open MPI's daemons cannot start across the namespaces here, the
# emulation itself does not work on this machine, which is a skip; the allreduce below is the part that must pass.
if [ "$rc" -eq 124 ]; then echo "cluster_smoke: Open MPI could not start a trivial job across the emulated hosts (above): skipped"; exit 77; fi
[ "$rc" -eq 0 ] || { echo "FAIL: cluster.sh exited $rc placing 4 ranks on 2 hosts"; exit 1; }
where=$(cat "$log")
for r in 0 1; do echo "$where" | grep -q "rank=$r host=0 " || { echo "FAIL: rank $r not on host 0"; exit 1; }; done
for r in 2 3; do echo "$where" | grep -q "rank=$r host=1 " || { echo "FAIL: rank $r not on host 1"; exit 1; }; done
spaces=$(echo "$where" | grep -o "netns=net:\[[0-9]*\]" | sort -u | wc -l)
[ "$spaces" -eq 2 ] || { echo "FAIL: the 4 ranks ran in $spaces network namespaces, expected 2"; exit 1; }

# One codec of each class (summable, gatherable, requantizable, rounds), each row checked element by element against
# the node sums / world size composed with its algorithm across the two leaders (perf_reference.cc).
"$here/cluster.sh" 2 2 --link 1gbit --timeout 60 -- "$perf" --hierarchical --min-bytes 64K --max-bytes 1M --factor 16 --iters 1 \
  --rows 64 --specs "fp16;topk:ratio=0.01;qsgd;powersgd:rank=2" || { echo "FAIL: hierarchical allreduce across the emulated hosts"; exit 1; }

after=$(ip netns list | grep -o "gc-[a-z0-9]*-[0-9]*" | sort)
if [ "$before" != "$after" ]; then  # other cluster runs may be going on: compare, don't require none
  echo "FAIL: cluster.sh left namespaces behind"; ip netns list; exit 1
fi
echo "cluster_smoke: ok"
