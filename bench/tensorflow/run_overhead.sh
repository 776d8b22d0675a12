#!/usr/bin/env bash
# The TF-binding overhead figure of docs/tensorflow.md: step_overhead.py for torch and tf on the same 25M-parameter
# MLP, 4 ranks (mpirun, the runtime backend), codec `none`, then the ratio tf / torch of the median step times.
# usage: bench/tensorflow/run_overhead.sh [BUILD_DIR] [RANKS]   (run on an idle machine; ~3 minutes; OMP_NUM_THREADS sets the compute threads of both, default 1)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build} ranks=${2:-4}
export PYTHONPATH=$build/python OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mpi=(mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x PYTHONPATH -x OMP_NUM_THREADS)
torch=$("${mpi[@]}" "$root/.venv/bin/python" "$root/bench/tensorflow/step_overhead.py" --framework torch | grep '^{')
tf=$("${mpi[@]}" "$root/.venv-tf/bin/python" "$root/bench/tensorflow/step_overhead.py" --framework tf | grep '^{')
echo "$torch"
echo "$tf"
python3 - "$torch" "$tf" <<'PY'
import json, sys
t, f = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"tf / torch median step: {f['median_step_s']:.4f} / {t['median_step_s']:.4f} s = "
      f"{f['median_step_s'] / t['median_step_s']:.3f}x (target <= 1.15)")
PY
