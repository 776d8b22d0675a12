#!/usr/bin/env bash
# usage: mpi_dead_rank_check.sh NP MPIEXEC [MPI FLAGS...] -- EXE
# Runs EXE on NP ranks (the last one dies) and passes iff every survivor printed a Timeout or CommError marker within
# 3 s + 7 s of slack. mpirun's own exit status is ignored: it reports the dead rank, which is the point.
set -uo pipefail
np=$1; shift
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
shift
exe=$1
output=$(timeout 90 "${launcher[@]}" --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0 \
         -np "$np" "$exe" 2>&1)
echo "$output"
survivors=$((np - 1))
good=$(echo "$output" | grep -cE "^SURVIVOR rank [0-9]+ of $np: (Timeout|CommError) after [0-9]+ ms" || true)
slow=$(echo "$output" | grep -E "^SURVIVOR" | awk '{ for (i = 1; i <= NF; ++i) if ($i == "after") print $(i + 1) }' |
       awk '$1 > 10000' | wc -l)
echo "[check] $good of $survivors survivors reported Timeout/CommError; $slow took longer than 10 s"
[ "$good" -eq "$survivors" ] && [ "$slow" -eq 0 ]
