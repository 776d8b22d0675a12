#!/usr/bin/env bash
# `pip install ./python` as a user does it (issue 30): the working tree's tracked and new files (what a clean clone
# holds, no build folders) are copied to SCRATCH/src, a fresh venv is made (with the system's site packages, for
# torch and mpi), the package is installed into it with pip (build isolation: scikit-build-core and nanobind from
# PyPI; the wheel's configuration, GRADCOMP_NATIVE=OFF, no -Werror), and a 2-rank job runs allreduces through the
# installed package from outside the source tree. Exits 77 (skipped) only when PyPI cannot be reached.
#
# usage: pip_install_test.sh SOURCE_ROOT SCRATCH MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
root=$1; scratch=$2; shift 2
mpiexec=("$@")
mkdir -p "$scratch"
rm -rf "$scratch/src" "$scratch/venv" "$scratch/run"
mkdir -p "$scratch/src" "$scratch/run"

echo "[pip-install] copying the working tree's files (no build folders) to $scratch/src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --no-recursion) \
  | tar -xf - -C "$scratch/src"

/usr/bin/python3 -m venv --system-site-packages "$scratch/venv"
if ! "$scratch/venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$scratch/probe" nanobind \
    scikit-build-core \
    >"$scratch/probe.log" 2>&1; then
  echo "[pip-install] skipped: PyPI is not reachable (pip download of nanobind and scikit-build-core failed):"; tail -3 "$scratch/probe.log"
  exit 77
fi
echo "[pip-install] pip install $scratch/src/python (log: $scratch/pip.log)"
start=$(date +%s)
if ! "$scratch/venv/bin/pip" install --disable-pip-version-check -v "$scratch/src/python" >"$scratch/pip.log" 2>&1; then
  # pip that could not fetch the build requirements (network) before building anything: skipped, as without PyPI.
  if ! grep -q "Building wheel for gradcomp" "$scratch/pip.log" \
      && grep -qE "Could not find a version|ConnectionError|NewConnectionError|Read timed out|HTTPSConnectionPool|\
No matching distribution" "$scratch/pip.log"; then
    echo "[pip-install] skipped: pip could not fetch the build requirements from PyPI:"
    grep -m 3 -E "Could not find|Connection|timed out|No matching" "$scratch/pip.log" | cut -c1-300
    exit 77
  fi
  # The first error lines come first: a CI log keeps the start of a failing test's output.
  echo "[pip-install] FAILED: pip install ./python after $(( $(date +%s) - start )) s; first errors:"
  grep -m 12 -E "error:|ERROR|CMake Error|fatal|No space|Killed|timed out|[Cc]ould not|[Cc]annot|Traceback" "$scratch/pip.log" | cut -c1-300 || true
  echo "[pip-install] environment: $(env | grep -E '^(PIP_|CMAKE|CC=|CXX=|CFLAGS|CXXFLAGS|LDFLAGS|CCACHE|SKBUILD)' \
    | tr '\n' ' ')"
  df -h "$scratch" | tail -1
  tail -40 "$scratch/pip.log"; exit 1
fi
echo "[pip-install] installed in $(( $(date +%s) - start )) s"

cat >"$scratch/run/check.py" <<'PY'
import os
import sys

import torch

import gradcomp
import gradcomp.torch as hvd

venv = sys.argv[1]
assert os.path.realpath(gradcomp.__file__).startswith(os.path.realpath(venv)), \
    f"gradcomp imported from {gradcomp.__file__}, not from the venv {venv}"
hvd.init()  # under mpirun: the C++ fusion runtime over MPI
rank, size = hvd.rank(), hvd.size()
x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
expected = torch.arange(1000, dtype=torch.float32) * sum(r + 1 for r in range(size)) / size
got = hvd.allreduce(x, name="dense")
assert torch.equal(got, expected), f"rank {rank}: dense average wrong (max diff {(got - expected).abs().max()})"
half = hvd.allreduce(x, name="fp16", compression=hvd.Compression.fp16)
assert float((half - expected).abs().max()) <= 1e-3 * float(expected.abs().max()), f"rank {rank}: fp16 average wrong"
print(f"rank {rank}: pip-installed gradcomp {gradcomp.__file__}: allreduce ok", flush=True)
PY
cd "$scratch/run"
env -u PYTHONPATH OMP_NUM_THREADS=1 "${mpiexec[@]}" -np 2 "$scratch/venv/bin/python" check.py "$scratch/venv" \
  | tee "$scratch/run.log" || { echo "[pip-install] FAILED: the 2-rank run of the installed package"; exit 1; }
[ "$(grep -c 'allreduce ok' "$scratch/run.log")" -eq 2 ] || { echo "[pip-install] FAILED: not every rank ok"; exit 1; }
echo "[pip-install] ok"
