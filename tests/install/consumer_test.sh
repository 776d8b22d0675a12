#!/usr/bin/env bash
# usage: consumer_test.sh BUILD_DIR CONSUMER_SOURCE SCRATCH_DIR
set -euo pipefail
build=$1; source=$2; scratch=$3
rm -rf "$scratch"; mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >"$scratch/install.log"
cmake -S "$source" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" >"$scratch/configure.log"
cmake --build "$scratch/build" >"$scratch/build.log"
LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/build/consumer" | tee "$scratch/run.log"
grep -q "consumer ok" "$scratch/run.log"
