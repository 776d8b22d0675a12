#!/usr/bin/env bash
# A second Python venv with PyTorch 2.x from PyPI (GRADCOMP_TORCH2_VERSION, default 2.11.0), beside .venv's Debian
# torch 1.13, so scripts/test.sh runs the python label on both. PyPI's Linux wheel is the CUDA build: it imports and
# runs on the CPU when the CUDA toolkit's lib64 (/usr/local/cuda) and three small NVIDIA wheels are on
# LD_LIBRARY_PATH; the rest of its CUDA dependencies (cuDNN, cuBLAS, NCCL wheels: gigabytes) are not installed.
# Sourced by scripts/test.sh: gradcomp_install_torch2 sets GRADCOMP_TORCH2_PYTHON and GRADCOMP_TORCH2_LD_PATH, or
# GRADCOMP_TORCH2_SKIP (the reason) when it cannot be installed here (no network, no CUDA toolkit).
# Run alone: scripts/torch2-deps.sh prints what it made. It holds nanobind too, so it is the python the GPU dry run
# builds against (PYTHON=.venv-torch2/bin/python bench/gpu/check.sh --dry-run).

GRADCOMP_ROOT=${GRADCOMP_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
GRADCOMP_TORCH2_VENV=${GRADCOMP_TORCH2_VENV:-$GRADCOMP_ROOT/.venv-torch2}
GRADCOMP_TORCH2_VERSION=${GRADCOMP_TORCH2_VERSION:-2.11.0}
GRADCOMP_CUDA_LIB=${GRADCOMP_CUDA_LIB:-/usr/local/cuda/lib64}

# The exact versions torch 2.11.0's metadata pins for the three libraries it loads at import on a machine without
# their PyPI copies of the toolkit.
gradcomp_torch2_wheels=(
  "torch==$GRADCOMP_TORCH2_VERSION" "nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5" "nvidia-cufile"
)
gradcomp_torch2_python_deps=(filelock "typing-extensions>=4.10" "setuptools<82" "sympy>=1.13.3" "networkx>=2.5.1" jinja2
                             "fsspec>=0.8.5" numpy pytest cloudpickle matplotlib nanobind)

gradcomp_torch2_ld_path() {
  local site
  site=$("$GRADCOMP_TORCH2_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  local dirs=("$GRADCOMP_CUDA_LIB")
  local d
  for d in "$site"/nvidia/*/lib; do [ -d "$d" ] && dirs+=("$d"); done
  (IFS=:; echo "${dirs[*]}")
}

gradcomp_install_torch2() {
  unset GRADCOMP_TORCH2_SKIP
  if [ ! -d "$GRADCOMP_CUDA_LIB" ]; then
    GRADCOMP_TORCH2_SKIP="no CUDA toolkit libraries at $GRADCOMP_CUDA_LIB (PyPI's torch wheel needs them to import)"
    return 0
  fi
  local py="$GRADCOMP_TORCH2_VENV/bin/python"
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$GRADCOMP_TORCH2_VERSION')" \
      >/dev/null 2>&1 || ! LD_LIBRARY_PATH="$(gradcomp_torch2_ld_path 2>/dev/null)" "$py" -c "import torch" \
      >/dev/null 2>&1; then
    echo "[deps] creating $GRADCOMP_TORCH2_VENV (torch $GRADCOMP_TORCH2_VERSION from PyPI, CPU use)"
    [ -x "$py" ] || /usr/bin/python3 -m venv "$GRADCOMP_TORCH2_VENV" || {
      GRADCOMP_TORCH2_SKIP="could not create the venv $GRADCOMP_TORCH2_VENV"; return 0; }
    if ! "$GRADCOMP_TORCH2_VENV/bin/pip" install -q --disable-pip-version-check --no-deps "${gradcomp_torch2_wheels[@]}" \
        || ! "$GRADCOMP_TORCH2_VENV/bin/pip" install -q --disable-pip-version-check "${gradcomp_torch2_python_deps[@]}"; then
      GRADCOMP_TORCH2_SKIP="pip could not install torch $GRADCOMP_TORCH2_VERSION (no network to PyPI?)"
      return 0
    fi
  fi
  GRADCOMP_TORCH2_LD_PATH=$(gradcomp_torch2_ld_path)
  GRADCOMP_TORCH2_PYTHON=$py
  local version
  if ! version=$(LD_LIBRARY_PATH="$GRADCOMP_TORCH2_LD_PATH" "$py" -c "import torch; print(torch.__version__)" 2>&1); then
    GRADCOMP_TORCH2_SKIP="torch $GRADCOMP_TORCH2_VERSION does not import here: ${version##*$'\n'}"
    return 0
  fi
  export GRADCOMP_TORCH2_PYTHON GRADCOMP_TORCH2_LD_PATH
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  gradcomp_install_torch2
  if [ -n "${GRADCOMP_TORCH2_SKIP:-}" ]; then echo "torch 2: not installed: $GRADCOMP_TORCH2_SKIP"; exit 1; fi
  echo "GRADCOMP_TORCH2_PYTHON=$GRADCOMP_TORCH2_PYTHON"
  echo "GRADCOMP_TORCH2_LD_PATH=$GRADCOMP_TORCH2_LD_PATH"
fi
