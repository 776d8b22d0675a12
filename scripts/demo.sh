#!/usr/bin/env bash
# gradcomp's main job: compression vs accuracy on Fashion-MNIST. Installs what is missing (scripts/deps.sh: Debian's
# PyTorch, matplotlib, Open MPI and dataset-fashion-mnist; a venv with nanobind), builds the library and its Python
# module with CMake into build-demo/, then trains a model data-parallel on 4 MPI ranks of this machine through
# gradcomp.torch once per compressor (none, fp16, qsgd 4-bit, terngrad, onebit, topk 1%, randomk 1%, blocktopk 1%,
# dgc 0.1%) and prints the table; results/accuracy.csv and results/accuracy.png are written.
#
# usage: scripts/demo.sh [bench/accuracy/run.py options]     e.g. --full, --ranks 2, --compressors none,fp16
# The default sweep took 138 s on the shared 2-core VM with the build done, 282 s building from scratch in a fresh
# worktree (docs/accuracy.md); --full (a CNN, 20 epochs) takes about 100 minutes on an idle 2-core machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
case "${1:-}" in -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; echo; exec python3 bench/accuracy/run.py --help ;; esac
start=$(date +%s)
source scripts/deps.sh
gradcomp_install_all
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

# Training runs on the CPU, so the CUDA kernels are not built here (scripts/test.sh builds them when nvcc exists).
build_dir=${GRADCOMP_DEMO_BUILD:-build-demo}
echo "[demo] configure + build $build_dir (library, Python module; logs in $build_dir/demo-*.log)"
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_WITH_CUDA=OFF -DGRADCOMP_WITH_PYTHON=ON \
  -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF -DPython_EXECUTABLE="$GRADCOMP_VENV/bin/python" \
  >"$build_dir/demo-configure.log" 2>&1 || { cat "$build_dir/demo-configure.log"; exit 1; }
cmake --build "$build_dir" -j 2 >"$build_dir/demo-build.log" 2>&1 \
  || { tail -n 60 "$build_dir/demo-build.log"; echo "[demo] build failed (log: $build_dir/demo-build.log)" >&2; exit 1; }
echo "[demo] built in $(( $(date +%s) - start )) s"

set +e
"$GRADCOMP_VENV/bin/python" bench/accuracy/run.py --build-dir "$build_dir" --out results "$@"
rc=$?
set -e
echo "[demo] total wall time $(( $(date +%s) - start )) s"
exit $rc
