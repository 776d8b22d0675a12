#!/usr/bin/env bash
# Builds Horovod 0.28.1 from PyPI into a venv of its own (default .peers/horovod, with the system site packages so
# it sees Debian's PyTorch), for the side-by-side benchmark (bench/peers/horovod.sh). PyTorch and MPI on; TensorFlow,
# MXNet and Gloo off. Installs the Debian packages its build needs (libtorch-dev, pybind11-dev, Open MPI, cmake).
# Takes about 7 minutes on 2 idle cores; a venv that already imports horovod.torch is reused. Not part of
# scripts/test.sh.  usage: bench/peers/horovod_build.sh [VENV]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
venv=${1:-$ROOT/.peers/horovod}
source "$ROOT/scripts/deps.sh"
gradcomp_install_debian libtorch-dev pybind11-dev
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import horovod.torch" 2>/dev/null; then
  echo "[horovod] $venv already has $("$venv/bin/python" -c 'import horovod; print(horovod.__version__)')"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check cloudpickle psutil pyyaml packaging cffi
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITHOUT_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j2 CMAKE_BUILD_PARALLEL_LEVEL=2
echo "[horovod] building horovod 0.28.1 into $venv (several minutes)"
"$venv/bin/pip" install --no-cache-dir --no-build-isolation --disable-pip-version-check -v horovod==0.28.1 \
  >"$venv/build.log" 2>&1 || { tail -40 "$venv/build.log"; echo "[horovod] build failed: $venv/build.log" >&2; exit 1; }
"$venv/bin/python" -c "import horovod.torch as hvd; print('[horovod] built', hvd.__version__ if hasattr(hvd, '__version__') else '')"
