#!/usr/bin/env bash
# Configures and builds the simulated allreduce_perf (bench/sim/CMakeLists.txt) into DIR (default build-sim/), two
# jobs, with the shared ccache. Needs SimGrid (scripts/sim-deps.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$ROOT/build-sim}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
command -v ccache >/dev/null && export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$ROOT/bench/sim" -B "$build" "${generator[@]}" >"${TMPDIR:-/tmp}/gradcomp-sim-configure.log" 2>&1 \
    || { cat "${TMPDIR:-/tmp}/gradcomp-sim-configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j 2 >&2
