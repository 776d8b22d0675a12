#!/usr/bin/env bash
# Runs the three speed benchmarks that carry issue targets, one after another, and keeps their raw output:
# compressors_bench (issue 3), allreduce_perf on a 1 Gbit/s shaped loopback (issue 5) and hooks_bench on the same
# link (issue 7). Run it on a quiet machine: every figure is a ratio measured within one run, but two cores shared
# with other work still move them.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/targets.sh [--build-dir DIR] [--out DIR] [--python PY]

  --build-dir DIR  a Release build with GRADCOMP_BUILD_BENCH=ON and GRADCOMP_WITH_PYTHON=ON (default: build)
  --out DIR        where compressors.txt, allreduce.txt, hooks.jsonl and uptime.txt go (default: results/targets)
  --python PY      the Python with torch for hooks_bench (default: .venv/bin/python)
Needs root (bench/net/shaped.sh creates a network namespace) and mpirun.
USAGE
}
root=$(cd "$(dirname "$0")/.." && pwd)
build=build out=results/targets py=.venv/bin/python
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "targets.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
cd "$root"
for f in "$build/bench/kernels/compressors_bench" "$build/bench/comm/allreduce_perf" "$py"; do
  [[ -x $f ]] || { echo "targets.sh: $f not found or not executable (build with -DGRADCOMP_BUILD_BENCH=ON)" >&2; exit 2; }
done
mkdir -p "$out"
export PYTHONPATH=$build/python OMP_NUM_THREADS=1
stamp() { echo "$(date -u +%FT%TZ) $1: $(uptime)" >>"$out/uptime.txt"; }
stamp start
echo "[1/3] compressors_bench (issue 3) -> $out/compressors.txt"
timeout 1200 "$build/bench/kernels/compressors_bench" >"$out/compressors.txt" 2>&1
stamp compressors
echo "[2/3] allreduce_perf, 4 ranks, 100 MiB, 1 Gbit/s (issue 5) -> $out/allreduce.txt"
timeout 1200 bench/net/shaped.sh 1gbit -- mpirun --allow-run-as-root --oversubscribe -np 4 \
  "$build/bench/comm/allreduce_perf" --bytes 100M --iters 3 \
  --specs "fp16,qsgd:bits=4,topk:ratio=0.01,dgc:ratio=0.001" >"$out/allreduce.txt" 2>&1
stamp allreduce
echo "[3/3] hooks_bench, 4 ranks, 1 Gbit/s (issue 7) -> $out/hooks.jsonl"
timeout 1800 bench/net/shaped.sh 1gbit -- mpirun --allow-run-as-root --oversubscribe -np 4 -x PYTHONPATH \
  -x OMP_NUM_THREADS "$py" bench/torch/hooks_bench.py --json \
  --rows floor:compute,floor:wire_fp16,torch:allreduce,torch:fp16,torch:powersgd1,gradcomp:topk:ratio=0.01,gradcomp:dgc,gradcomp:fp16,optimizer:topk:ratio=0.01,optimizer:fp16 \
  >"$out/hooks.jsonl" 2>&1
stamp hooks
grep -E '^\| (codec|[a-z0-9]+ \|)' "$out/compressors.txt" || true
grep -vE '^(#| +spec |$)' "$out/allreduce.txt" | awk '!seen[$0]++'  # rows once (the dense baseline heads every table)
grep '^{' "$out/hooks.jsonl" || true
