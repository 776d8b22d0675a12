#!/usr/bin/env bash
# Horovod beside gradcomp in one run: builds Horovod 0.28.1 into its own venv (bench/peers/horovod_build.sh, cached),
# then runs bench/peers/peer_train.py on 4 ranks once per (link, model, framework, compression) — Horovod none and
# fp16; gradcomp none, fp16, topk 1% and dgc 0.1% — unshaped and on shaped loopbacks (bench/net/shaped.sh), and
# prints a table: s/step, samples/s, gradcomp / Horovod at the same compression and link, and each link's
# throughput as a fraction of the unshaped run's. Not part of scripts/test.sh; run on an otherwise idle machine.
#
# usage: bench/peers/horovod.sh [--links LIST] [--models LIST] [--ranks N] [--steps N] [--warmup N]
#                               [--image-size PX] [--out DIR] [--gradcomp-python PY] [--horovod-venv DIR]
#   --links LIST     comma-separated: none (unshaped), 1gbit, 100mbit, ... (one shaped loopback that all ranks
#                    share: its rate is the aggregate), or hosts:RATE (one emulated host per rank, each with its
#                    own RATE uplink: bench/net/cluster.sh RANKS 1 --link RATE) (default none,1gbit,100mbit)
#   --models LIST    mlp (25M-parameter, communication-bound), alexnet (default mlp,alexnet)
#   --ranks N        default 4;  --steps N timed steps (default 5);  --warmup N (default 2)
#   --image-size PX  alexnet's input (default 224; smaller runs faster)
#   --rows LIST      which runs, comma-separated FRAMEWORK:COMPRESSION, e.g. horovod:none,gradcomp:none
#                    (default all six: horovod none/fp16, gradcomp none/fp16/topk:ratio=0.01/dgc:ratio=0.001)
#   --repeat N       run the rows N times, alternating (default 1), to see the noise beside a ratio
#   --out DIR        where results.jsonl and table.md go (default bench-peers-<date>)
#   --gradcomp-python PY   the interpreter that imports gradcomp (default .venv/bin/python)
#   --horovod-venv DIR     default .peers/horovod
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
links=none,1gbit,100mbit models=mlp,alexnet ranks=4 steps=5 warmup=2 image=224 repeat=1
rows="horovod:none,gradcomp:none,horovod:fp16,gradcomp:fp16,gradcomp:topk:ratio=0.01,gradcomp:dgc:ratio=0.001"
out="bench-peers-$(date +%Y%m%d-%H%M)" gc_py=$ROOT/.venv/bin/python hvd_venv=$ROOT/.peers/horovod
while [ $# -gt 0 ]; do
  case "$1" in
    --links) links=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --image-size) image=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --gradcomp-python) gc_py=$2; shift 2 ;;
    --horovod-venv) hvd_venv=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "horovod.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bench/peers/horovod_build.sh "$hvd_venv"
"$gc_py" -c "import gradcomp.torch" || { echo "horovod.sh: $gc_py cannot import gradcomp.torch (run scripts/test.sh)" >&2; exit 2; }
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"
echo "# started $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >"$out/run.log"

run_one() {  # link model framework compression
  local link=$1 model=$2 fw=$3 comp=$4 py=$gc_py
  [ "$fw" = horovod ] && py=$hvd_venv/bin/python
  local prog=("$py" bench/peers/peer_train.py --framework "$fw" --model "$model" --compression "$comp"
              --steps "$steps" --warmup "$warmup" --image-size "$image" --label "$link")
  local cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS=1 -x PYTHONPATH
             "${prog[@]}")
  echo "[peers] $link $model $fw $comp" | tee -a "$out/run.log" >&2
  local line
  if [ "$link" = none ]; then
    line=$(OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
      timeout 3600 "${cmd[@]}" 2>>"$out/run.log" | grep '^{' || true)
  elif [[ "$link" == hosts:* ]]; then
    local cluster=(bench/net/cluster.sh "$ranks" 1 --link "${link#hosts:}" --timeout 3600 --mpi-arg --bind-to
                   --mpi-arg none --mpi-arg -x --mpi-arg OMP_NUM_THREADS=1 --mpi-arg -x --mpi-arg PYTHONPATH --)
    line=$("${cluster[@]}" "${prog[@]}" 2>>"$out/run.log" | grep '^{' || true)
  else
    line=$(timeout 3600 bench/net/shaped.sh "$link" -- "${cmd[@]}" 2>>"$out/run.log" | grep '^{' || true)
  fi
  [ -n "$line" ] && echo "$line" | tee -a "$results" || echo "[peers] FAILED: $link $model $fw $comp" | tee -a "$out/run.log" >&2
}

for link in ${links//,/ }; do
  for model in ${models//,/ }; do
    for ((pass = 0; pass < repeat; ++pass)); do
      for row in ${rows//,/ }; do
        fw=${row%%:*}
        case "$fw" in horovod|gradcomp) ;; *) echo "horovod.sh: bad row '$row' (FRAMEWORK:COMPRESSION)" >&2; exit 2 ;; esac
        run_one "$link" "$model" "$fw" "${row#*:}"
      done
    done
  done
done
echo "# finished $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/run.log"
python3 bench/peers/peer_table.py "$results" | tee "$out/table.md"
