#!/usr/bin/env bash
# gradcomp's compressed allreduce on simulated clusters (SimGrid SMPI): builds build-sim/ when needed, runs
# allreduce_perf under smpirun, and writes results.jsonl, the PNG plots and tables.md (bench/sim/report.py).
#
# usage: bench/sim/run.sh [--out DIR] [--parts validate,scale,transformer] [--ranks "8 64 256"]
#                         [--gbit "100 200 400"] [--modes "flat hier auto"] [--gbps 1000] [--iters N]
#                         [--transformer-ranks "8 64"]
#   validate     the emulated clusters of docs/performance-peers.md (2 x 2 and 4 x 1 hosts, 1 Gbit/s uplinks), 16 MiB,
#                the real CPU codecs, their time measured by SMPI (one core per rank)
#   scale        nodes of 8 ranks (NVLink-class inside, --gbit per node NIC), --ranks, ResNet-50's 100 MB,
#                modeled codecs (sim_*: the real codec's payload sizes and algorithms, --gbps GB/s per pass)
#   transformer  the same for a 1.3B-parameter transformer (1.3e9 f32 values), at --transformer-ranks (8 and 64)
# Each smpirun is one layout x mode; flat, hierarchical and auto (learn_links, then the cost model's choice per row).
# Long: run under nice on a shared machine (docs/scaling.md has the times). 1,024 ranks: --ranks 1024 --modes hier
# (about 6 min); flat there had not finished qsgd's row after 39 min (SimGrid matches each of a million messages in
# flight by a linear scan), so the default stops at 256.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
out=$ROOT/results-sim; parts=validate,scale; ranks="8 64 256"; gbits="100 200 400"; modes="flat hier auto"
gbps=1000; iters=""; build=$ROOT/build-sim; transformer_ranks="8 64"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --parts) parts=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --transformer-ranks) transformer_ranks=$2; shift ;;
    --gbit) gbits=$2; shift ;;
    --modes) modes=$2; shift ;;
    --gbps) gbps=$2; shift ;;
    --iters) iters=$2; shift ;;
    --build-dir) build=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v smpirun >/dev/null || { echo "run.sh: smpirun not found: run scripts/sim-deps.sh" >&2; exit 3; }
out=$(realpath -m "$out")
case "$out/" in
  /tmp/*) echo "run.sh: --out $out is under /tmp, which the simulation replaces by a private tmpfs" \
            "(bench/sim/tmpfs.sh): choose a directory elsewhere" >&2; exit 2 ;;
esac
# Folded buffers are mappings: the transformer's 64-rank auto run holds about 50,000, past Linux's default limit of
# 65,530 at its peaks ("Could not map folded virtual memory (Cannot allocate memory)"). Raise it (as root) for the
# transformer part, or say how.
if [[ ,$parts, == *,transformer,* ]] && [ "$(cat /proc/sys/vm/max_map_count 2>/dev/null || echo 0)" -lt 1048576 ]; then
  if [ "$(id -u)" = 0 ] && sysctl -qw vm.max_map_count=1048576 2>/dev/null; then
    echo "[sim] vm.max_map_count raised to 1048576 (folded 5.2 GB buffers need more mappings than 65,530)" >&2
  else
    echo "run.sh: the transformer part needs vm.max_map_count >= 1048576 (now $(cat /proc/sys/vm/max_map_count));" \
         "run: sudo sysctl -w vm.max_map_count=1048576" >&2
    exit 3
  fi
fi
"$ROOT/bench/sim/build.sh" "$build"
mkdir -p "$out/platforms"
results=$out/results.jsonl
: >"$results"
platforms=$ROOT/bench/sim/platforms

# SMPI options of every run: the simulated clock ticks only in communication and charged computation (MPI_Test and
# MPI_Wtime inject nothing), collectives follow Open MPI's algorithm selection except broadcasts (scatter + allgather:
# Open MPI's choice for a large broadcast, a segmented binary tree of 1 KiB pieces, costs the simulator hours at
# 100 MB), folded blocks of 32 MiB.
smpi_common=(--cfg=smpi/test:0 --cfg=smpi/wtime:0 --cfg=smpi/coll-selector:ompi --cfg=smpi/bcast:scatter_rdb_allgather
             --cfg=smpi/host-speed:1Gf
             --cfg=smpi/shared-malloc-blocksize:33554432 --log=root.thres:warning)

# run TAGS_JSON NP PLATFORM.xml [env...] -- allreduce_perf args: appends every JSON row, tagged, to results.jsonl.
run() {
  local tags=$1 np=$2 platform=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local start=$SECONDS log=$out/last-run.log
  echo "[sim] $tags ($np ranks)" >&2
  if ! env "${envs[@]}" "$ROOT/bench/sim/tmpfs.sh" smpirun -np "$np" -platform "$platform" -hostfile "${platform%.xml}.hosts" \
      "$build/allreduce_perf.so" "${smpi_common[@]}" "$@" --json >"$log" 2>&1; then
    echo "[sim] failed: $tags" >&2; tail -20 "$log" >&2; return 1
  fi
  python3 - "$tags" "$((SECONDS - start))" "$log" >>"$results" <<'PY'
import json, sys
tags = json.loads(sys.argv[1]); tags["wall_s"] = int(sys.argv[2])
for line in open(sys.argv[3]):
    if line.startswith("{"):
        row = json.loads(line); row.update(tags); print(json.dumps(row))
PY
}

mode_flags() {
  case "$1" in flat) echo "" ;; hier) echo "--hierarchical" ;; auto) echo "--hierarchy-auto" ;; esac
}

if [[ ,$parts, == *,validate,* ]]; then
  for layout in 2x2 4x1; do
    hosts=${layout%x*}; per=${layout#*x}
    for mode in $modes; do
      # shellcheck disable=SC2046
      run "{\"part\": \"validate\", \"layout\": \"$layout\", \"mode\": \"$mode\"}" 4 \
        "$platforms/emulated-$layout-1gbit.xml" GRADCOMP_LOCAL_SIZE="$per" -- $(mode_flags "$mode") \
        --bytes 16M --iters "${iters:-3}" --specs "fp16;qsgd:bits=4;topk:ratio=0.01;dgc:ratio=0.001"
      : "$hosts"
    done
  done
fi

# Modeled sweep of one model: --bytes and --rows (PowerSGD's matrix) for each NIC rate, rank count and mode.
sweep() {
  local part=$1 bytes=$2 rows=$3 counts=$4
  local specs="sim_fp16:gbps=$gbps;sim_qsgd:bits=4,gbps=$gbps;sim_topk:ratio=0.01,gbps=$gbps"
  specs+=";sim_dgc:ratio=0.001,gbps=$gbps;sim_powersgd:rank=4,gbps=$gbps"
  for gbit in $gbits; do
    for np in $counts; do
      local nodes=$(( (np + 7) / 8 )) per=$(( np < 8 ? np : 8 ))
      local platform=$out/platforms/gpu-${nodes}x${per}-${gbit}gbit.xml
      [ -f "$platform" ] || python3 "$platforms/make_platform.py" "$nodes" "$per" --nic "${gbit}Gbps" --nic-lat 2us \
        --intra 400GBps --intra-lat 1us --out "$platform"
      for mode in $modes; do
        # shellcheck disable=SC2046
        run "{\"part\": \"$part\", \"gbit\": $gbit, \"mode\": \"$mode\", \"gbps\": $gbps}" "$np" "$platform" \
          GRADCOMP_LOCAL_SIZE="$per" GRADCOMP_SIM_SHARED_BYTES=1048576 -- --cfg=smpi/simulate-computation:no \
          $(mode_flags "$mode") --bytes "$bytes" --rows "$rows" --iters "${iters:-1}" --no-check \
          --baseline "sim_none:gbps=$gbps" --specs "$specs"
      done
    done
  done
}

[[ ,$parts, == *,scale,* ]] && sweep scale 102400000 5000 "$ranks"
[[ ,$parts, == *,transformer,* ]] && sweep transformer 5200000000 40000 "$transformer_ranks"

/usr/bin/python3 "$ROOT/bench/sim/report.py" "$results" --out "$out"
echo "[sim] results: $results, tables: $out/tables.md"
