#!/usr/bin/env bash
# usage: mpi_fault_check.sh SCENARIO NP EXPECTED MPIEXEC [MPI FLAGS...] -- EXE
# Runs `EXE SCENARIO` on NP ranks (tests/comm/mpi_fault.cc) and passes iff EXPECTED ranks printed a PASS verdict and
# none printed FAIL. mpirun's exit status is ignored: a killed or never-finalized rank is what the test is about.
set -uo pipefail
scenario=$1 np=$2 expected=$3; shift 3
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
shift
exe=$1
output=$(timeout 60 "${launcher[@]}" --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0 \
         -np "$np" "$exe" "$scenario" 2>&1)
echo "$output"
pass=$(echo "$output" | grep -c "^PASS rank" || true)
fail=$(echo "$output" | grep -c "^FAIL rank" || true)
echo "[check] $scenario on $np ranks: $pass PASS (need $expected), $fail FAIL"
[ "$pass" -eq "$expected" ] && [ "$fail" -eq 0 ]
