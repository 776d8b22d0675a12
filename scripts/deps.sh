#!/usr/bin/env bash
# Installs what gradcomp needs on a Debian machine, only what is missing: Debian packages (as root, through apt-get)
# and a Python venv (.venv, with the system's PyTorch visible) holding nanobind and scikit-build-core.
# Idempotent; sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail

GRADCOMP_ROOT=${GRADCOMP_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
GRADCOMP_VENV=${GRADCOMP_VENV:-$GRADCOMP_ROOT/.venv}

gradcomp_debian_packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libopenblas-dev
  python3 python3-dev python3-venv python3-pip python3-numpy python3-pytest python3-matplotlib python3-torch
  python3-cloudpickle
  dataset-fashion-mnist iproute2 procps
)

gradcomp_install_debian() {
  local missing=()
  for pkg in "${gradcomp_debian_packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[deps] installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

gradcomp_install_python() {
  if [ ! -x "$GRADCOMP_VENV/bin/python" ]; then
    echo "[deps] creating $GRADCOMP_VENV (system site packages: Debian's PyTorch)"
    /usr/bin/python3 -m venv --system-site-packages "$GRADCOMP_VENV"
  fi
  if ! "$GRADCOMP_VENV/bin/python" -c "import nanobind, scikit_build_core" 2>/dev/null; then
    echo "[deps] installing nanobind and scikit-build-core into $GRADCOMP_VENV"
    "$GRADCOMP_VENV/bin/pip" install -q --disable-pip-version-check "nanobind>=2.0" "scikit-build-core>=0.10"
  fi
}

gradcomp_install_all() {
  gradcomp_install_debian "$@"
  gradcomp_install_python
}
