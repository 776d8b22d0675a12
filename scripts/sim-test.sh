#!/usr/bin/env bash
# The sim tests (CTest label sim, bench/sim/CMakeLists.txt): builds build-sim/ (bench/sim/build.sh) and runs them where
# SimGrid is installed (scripts/sim-deps.sh); elsewhere they are reported as skipped. Prints the human output on
# stderr and one line "PASSED FAILED SKIPPED" on stdout (scripts/test.sh adds it to its summary).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$ROOT/build-sim}
if ! command -v smpirun >/dev/null 2>&1 || [ ! -f /usr/include/smpi/mpi.h ]; then
  echo "[sim] SimGrid is not installed (scripts/sim-deps.sh): sim_hierarchical_2x2 SKIPPED" >&2
  echo "0 0 1"
  exit 0
fi
if ! "$ROOT/bench/sim/build.sh" "$build" >&2 2>&1; then
  echo "[sim] the simulated build failed" >&2
  echo "0 1 0"
  exit 0
fi
set +e
(cd "$build" && ctest --output-on-failure -L sim) >&2
rc=$?
set -e
total=$(cd "$build" && ctest -N -L sim | sed -n 's/^Total Tests: //p')
failed=$(grep -c . "$build/Testing/Temporary/LastTestsFailed.log" 2>/dev/null || true)
[ "$rc" -ne 0 ] && [ "${failed:-0}" -eq 0 ] && failed=1
echo "$(( ${total:-0} - ${failed:-0} )) ${failed:-0} 0"
