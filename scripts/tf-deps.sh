#!/usr/bin/env bash
# Installs TensorFlow for gradcomp.tensorflow into a venv of its own, only when missing: .venv-tf (GRADCOMP_TF_VENV),
# made from Debian's Python 3.11 with its system site packages (Debian's NumPy 1.24 and PyTorch stay visible:
# tensorflow-cpu 2.17 accepts NumPy >= 1.23.5, < 2, and pip installs no NumPy of its own), and tensorflow-cpu 2.17
# with Keras 3 from PyPI. A second venv, because TensorFlow brings its own protobuf, ml_dtypes, h5py and keras, which
# the project venv (.venv, PyTorch and PySpark) does not need. The nanobind module built for .venv serves it too (same
# interpreter): tests run it with PYTHONPATH=<build>/python, and scripts/test.sh adds the development .pth file.
# Sourced by scripts/test.sh (GRADCOMP_TF_DEPS=0 leaves it out); run it directly to install by hand. About 60 s and
# 1.2 GB on disk (the download is ~250 MB).
set -euo pipefail

GRADCOMP_ROOT=${GRADCOMP_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
GRADCOMP_TF_VENV=${GRADCOMP_TF_VENV:-$GRADCOMP_ROOT/.venv-tf}
GRADCOMP_TF_REQUIREMENT=${GRADCOMP_TF_REQUIREMENT:-"tensorflow-cpu==2.17.1"}
GRADCOMP_KERAS_REQUIREMENT=${GRADCOMP_KERAS_REQUIREMENT:-"keras>=3.5,<3.16"}

gradcomp_install_tf() {
  if [ ! -x "$GRADCOMP_TF_VENV/bin/python" ]; then
    echo "[deps] creating $GRADCOMP_TF_VENV (system site packages: Debian's NumPy and PyTorch)"
    /usr/bin/python3 -m venv --system-site-packages "$GRADCOMP_TF_VENV"
  fi
  if ! TF_CPP_MIN_LOG_LEVEL=3 "$GRADCOMP_TF_VENV/bin/python" -c "import tensorflow, keras" 2>/dev/null; then
    echo "[deps] installing $GRADCOMP_TF_REQUIREMENT $GRADCOMP_KERAS_REQUIREMENT into $GRADCOMP_TF_VENV"
    # A failed install leaves the TensorFlow tests skipped (tests/python/tf_launch.py says why), not the run broken.
    "$GRADCOMP_TF_VENV/bin/pip" install -q --disable-pip-version-check "$GRADCOMP_TF_REQUIREMENT" \
      "$GRADCOMP_KERAS_REQUIREMENT" || echo "[deps] TensorFlow could not be installed: its tests will be skipped"
  fi
  if [ -n "${1:-}" ]; then  # a build tree whose python/ folder the venv should import gradcomp from
    local site
    site=$("$GRADCOMP_TF_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$1/python" >"$site/gradcomp-dev.pth"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  gradcomp_install_tf "${1:-}"
  TF_CPP_MIN_LOG_LEVEL=3 "$GRADCOMP_TF_VENV/bin/python" -c \
    "import tensorflow as tf, keras, numpy; print('tensorflow', tf.__version__, 'keras', keras.__version__, 'numpy', numpy.__version__)"
fi
