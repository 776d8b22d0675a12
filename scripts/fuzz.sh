#!/usr/bin/env bash
# Builds the libFuzzer decode target with clang (ASan + UBSan + libFuzzer; warnings as errors, as in scripts/test.sh's
# gcc build, so the project's only clang build also keeps clang's warnings out) in build-fuzz/ and runs it for a
# bounded time. Exits non-zero if the fuzzer finds a crash, a sanitizer error, a leak or a contract violation; the
# offending input is saved under build-fuzz/artifacts/ (replay: build-fuzz/tests/fuzz/decode_fuzz <file>).
#
# usage: scripts/fuzz.sh [SECONDS]   (default 60; scripts/test.sh --fuzz [SECONDS] runs this after installing clang)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
seconds=${1:-60}
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
build_dir=${GRADCOMP_FUZZ_BUILD_DIR:-build-fuzz}
CC=${CC_FUZZ:-clang}
CXX=${CXX_FUZZ:-clang++}
command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (scripts/test.sh --fuzz installs clang)" >&2; exit 2; }

echo "[fuzz] configure $build_dir with $CXX"
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMP_FUZZ=ON -DGRADCOMP_SANITIZE=ON -DGRADCOMP_WITH_CUDA=OFF -DGRADCOMP_WERROR=ON \
  -DGRADCOMP_WITH_MPI=OFF -DGRADCOMP_WITH_PYTHON=OFF -DGRADCOMP_BUILD_BENCH=OFF -DGRADCOMP_NATIVE=OFF \
  >"$build_dir/configure.log" 2>&1 || { cat "$build_dir/configure.log"; exit 1; }
echo "[fuzz] build decode_fuzz"
cmake --build "$build_dir" -j 2 --target decode_fuzz

corpus="$build_dir/corpus/decode"
artifacts="$build_dir/artifacts"
mkdir -p "$corpus" "$artifacts"
# Seeds: valid payloads of every codec (raw mode, written by the target itself), and "valid-then-mutated" inputs
# (byte 1 bit 3) for the first 32 codec slots with numel 300 and 5.
for codec in $(seq 0 31); do
  printf "\\x$(printf %02x "$codec")\\x08\\x2c\\x01" >"$corpus/seed-$codec-300"
  printf "\\x$(printf %02x "$codec")\\x09\\x05\\x00" >"$corpus/seed-$codec-5"
done

GRADCOMP_FUZZ_WRITE_SEEDS="$corpus" "$build_dir/tests/fuzz/decode_fuzz" >/dev/null 2>&1 ||
  { echo "fuzz.sh: writing the seed corpus failed" >&2; exit 1; }

echo "[fuzz] running decode_fuzz for ${seconds}s"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
set +e
"$build_dir/tests/fuzz/decode_fuzz" "$corpus" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
  -max_len=4096 -len_control=20 -print_final_stats=1 -artifact_prefix="$artifacts/" 2>&1 | tee "$build_dir/fuzz.log" | tail -n 40
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "[fuzz] FAILED (exit $rc): see $build_dir/fuzz.log and $artifacts/" >&2
  exit "$rc"
fi
echo "[fuzz] no crash in ${seconds}s ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build_dir/fuzz.log" | grep -o '[0-9]*$' || echo '?') inputs)"
