#!/usr/bin/env bash
# Installs what the simulated build (bench/sim: gradcomp on SimGrid's SMPI) needs beyond scripts/deps.sh: Debian's
# libsimgrid-dev (SimGrid 3.32: smpirun, smpicxx, the SMPI headers and library). Idempotent; run as root or with sudo.
#   scripts/sim-deps.sh && bench/sim/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/deps.sh"
gradcomp_install_debian libsimgrid-dev
