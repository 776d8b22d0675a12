#!/usr/bin/env bash
# The flat-vs-hierarchical table on emulated hosts (issue 20, part 3): for each layout (HOSTSxRANKS) at one uplink
# rate, allreduce_perf runs flat, --hierarchical and --hierarchy-auto over the same specs in one cluster each
# (bench/net/cluster.sh), and Horovod's allreduce of the same size (none) with HOROVOD_HIERARCHICAL_ALLREDUCE=0 and 1
# when its venv exists (bench/peers/horovod_build.sh). Raw JSON lines go to OUT/raw.jsonl; the table (ms per call,
# slowest rank, and which mode auto took) to OUT/table.md. Root needed (cluster.sh); run on an otherwise idle machine.
#
# usage: bench/net/hierarchy_table.sh [--layouts LIST] [--link RATE] [--bytes B] [--iters N] [--out DIR]
#                                     [--perf PATH] [--horovod-venv DIR]
#   --layouts LIST   comma-separated HOSTSxRANKS (default 2x2,4x1)
#   --link RATE      per-host uplink (default 1gbit)
#   --bytes B        tensor bytes (default 16M)
#   --iters N        timed calls per row (default 3)
#   --perf PATH      allreduce_perf (default build-cpu/bench/comm/allreduce_perf, else build/...)
#   --horovod-venv D default .peers/horovod (skipped when absent)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
layouts=2x2,4x1 link=1gbit bytes=16M iters=3 out="hierarchy-$(date +%Y%m%d-%H%M)" hvd_venv=$ROOT/.peers/horovod perf=""
while [ $# -gt 0 ]; do
  case "$1" in
    --layouts) layouts=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --horovod-venv) hvd_venv=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "hierarchy_table.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$perf" ]; then
  for p in "$ROOT/build-cpu/bench/comm/allreduce_perf" "$ROOT/build/bench/comm/allreduce_perf"; do
    [ -x "$p" ] && { perf=$p; break; }
  done
fi
[ -x "${perf:-}" ] || { echo "hierarchy_table.sh: no allreduce_perf (build with -DGRADCOMP_BUILD_BENCH=ON, or --perf)" >&2; exit 2; }
mkdir -p "$out"
raw="$out/raw.jsonl"
: >"$raw"
specs="fp16;qsgd:bits=4;topk:ratio=0.01;dgc:ratio=0.001"
byte_count=$(python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))" "$bytes")
echo "[hierarchy] layouts $layouts, uplink $link, $bytes, $iters iters; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/run.txt"
for layout in ${layouts//,/ }; do
  hosts=${layout%x*} per=${layout#*x}
  for mode in flat hierarchical auto; do
    flag=(); [ $mode = hierarchical ] && flag=(--hierarchical); [ $mode = auto ] && flag=(--hierarchy-auto)
    "$ROOT/bench/net/cluster.sh" "$hosts" "$per" --link "$link" --timeout 900 -- "$perf" "${flag[@]}" --json \
      --min-bytes "$bytes" --max-bytes "$bytes" --iters "$iters" --specs "$specs" 2>>"$out/stderr.log" |
      python3 -c "import json,sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith('{'):
        d = json.loads(line); d.update(layout='$layout', mode='$mode', framework='gradcomp'); print(json.dumps(d))" >>"$raw"
  done
  if [ -x "$hvd_venv/bin/python" ]; then
    for h in 0 1; do
      "$ROOT/bench/net/cluster.sh" "$hosts" "$per" --link "$link" --timeout 600 \
        --mpi-arg -x --mpi-arg HOROVOD_HIERARCHICAL_ALLREDUCE=$h -- \
        "$hvd_venv/bin/python" "$ROOT/bench/peers/horovod_allreduce.py" --bytes "$byte_count" --iters "$iters" \
        2>>"$out/stderr.log" | python3 -c "import json,sys
for line in sys.stdin:
    if line.startswith('{'):
        d = json.loads(line); d.update(layout='$layout', mode='horovod-hier=$h'); print(json.dumps(d))" >>"$raw"
    done
  fi
done
echo "[hierarchy] done; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/run.txt"
python3 "$ROOT/bench/net/hierarchy_report.py" "$raw" | tee "$out/table.md"
