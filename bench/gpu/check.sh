#!/usr/bin/env bash
# gradcomp's one-shot GPU check. On a machine with an NVIDIA GPU, nvcc and CMake (PyTorch optional) it:
#   1. detects the GPU and its architecture (nvidia-smi --query-gpu=compute_cap: 9.0 -> sm_90 on H100/H200),
#   2. checks the build dependencies and says exactly which are missing,
#   3. configures a CUDA build for that architecture (no MPI or Python; NCCL when nccl.h is found) without -Werror
#      (a host compiler other than the one the code was written with must not fail the first run on a new warning),
#      and builds the library and the tests first,
#   4. runs the CUDA tests (CTest label gpu: the codec parity and, with NCCL, the NCCL communicator's one-rank test)
#      and their CPU halves (codec_parity_reference_test, canonical_nan_test, the cuda_check_test plumbing),
#   5. only then builds the benchmarks (a failed benchmark build is reported, after the test results) and runs
#      bench/kernels/compressors_bench_cuda (64M and 256M floats, fraction of a device-to-device copy), when a
#      CUDA PyTorch is importable torch.topk as the peer of gradcomp's top-k, bench/comm/device_path_bench (the
#      fused Runtime on 25M CUDA floats over NCCL: GB/s of gradient per step for none, fp16, qsgd 4-bit, top-k 1%,
#      DGC 0.1%, #wrong against the host path) and, with a CUDA PyTorch and nanobind, one DistributedOptimizer step
#      on CUDA parameters (bench/gpu/optimizer_step.py) and the Python collectives on CUDA tensors
#      (tests/python/test_cuda_collectives.py),
#   6. prints a short table last.
# Full logs go to $OUT when set, else ./gpu-results. Designed to finish within 8 minutes on an H200, build included.
#
# usage: bench/gpu/check.sh [--quick] [--build-dir DIR] [--jobs N] [--no-bench] [--help]
#   --quick        benchmark 64M floats only (3 repetitions)
#   --build-dir D  build directory (default: build-gpu in the repository root)
#   --jobs N       parallel build jobs (default: nproc, at most 16)
#   --no-bench     tests only
# Exit status: 0 all ran and every test passed; 1 a test failed; 2 the library/test build failed, or (tests all
# passed) the benchmark build failed; 3 no GPU; 4 dependencies missing.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RESULTS=${OUT:-$PWD/gpu-results}
BUILD_DIR="$ROOT/build-gpu"
JOBS=$(nproc 2>/dev/null || echo 4)
[ "$JOBS" -gt 16 ] && JOBS=16
QUICK=0
BENCH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --build-dir) BUILD_DIR=$(realpath -m "$2"); shift ;;
    --jobs) JOBS=$2; shift ;;
    --no-bench) BENCH=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$RESULTS"
LOG="$RESULTS/check.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
T0=$(date +%s)
say "gradcomp GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "results: $RESULTS"

# ---- 1. the GPU ------------------------------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "NO GPU: nvidia-smi is not installed, so there is no NVIDIA driver here; nothing to check (exit 3)."
  exit 3
fi
GPU_LINE=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>>"$LOG" | head -1)
if [ -z "$GPU_LINE" ]; then
  say "NO GPU: nvidia-smi found no usable NVIDIA GPU (see $LOG); nothing to check (exit 3)."
  exit 3
fi
GPU_NAME=$(echo "$GPU_LINE" | cut -d, -f1 | xargs)
CAP=$(echo "$GPU_LINE" | cut -d, -f2 | xargs)
ARCH=${CAP/./}
say "GPU: $GPU_LINE  -> CUDA architecture sm_$ARCH"
nvidia-smi >> "$LOG" 2>&1

# ---- 2. dependencies -------------------------------------------------------------------------------------------------
missing=()
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -z "$NVCC" ] && missing+=("nvcc (CUDA toolkit; looked on PATH and in /usr/local/cuda/bin)")
command -v cmake >/dev/null 2>&1 || missing+=("cmake >= 3.24")
if command -v cmake >/dev/null 2>&1; then
  cmv=$(cmake --version | head -1 | awk '{print $3}')
  if [ "$(printf '%s\n3.24\n' "$cmv" | sort -V | head -1)" != "3.24" ]; then missing+=("cmake >= 3.24 (found $cmv)"); fi
fi
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || missing+=("a C++20 compiler (g++ >= 11)")
GENERATOR="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GENERATOR=Ninja
have_cmake_pkg() {  # name header...: a CMake package config or a header in the usual prefixes
  local name=$1; shift
  for prefix in /usr /usr/local /opt/conda ${CONDA_PREFIX:-/nonexistent}; do
    ls "$prefix"/lib*/cmake/"$name"*/ "$prefix"/lib/*/cmake/"$name"*/ "$prefix"/share/cmake/"$name"*/ >/dev/null 2>&1 \
      && return 0
    for header in "$@"; do [ -e "$prefix/include/$header" ] && return 0; done
  done
  return 1
}
have_cmake_pkg fmt fmt/format.h || missing+=("fmt (apt-get install libfmt-dev)")
have_cmake_pkg GTest gtest/gtest.h || missing+=("GoogleTest (apt-get install libgtest-dev)")
HAVE_BENCHMARK=0
have_cmake_pkg benchmark benchmark/benchmark.h && HAVE_BENCHMARK=1
if [ ${#missing[@]} -gt 0 ]; then
  say "MISSING DEPENDENCIES (exit 4):"
  for m in "${missing[@]}"; do say "  - $m"; done
  exit 4
fi
[ $HAVE_BENCHMARK -eq 0 ] && say "note: Google Benchmark not found: the CPU benches are not built; the CUDA bench needs only the library."
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
NCCL_FLAG=OFF
for d in "$CUDA_HOME/include" /usr/include /usr/local/include ${CONDA_PREFIX:+$CONDA_PREFIX/include}; do
  [ -e "$d/nccl.h" ] && NCCL_FLAG=ON && break
done
[ $NCCL_FLAG = OFF ] && say "WARNING: nccl.h not found (CUDA include dir, /usr/include, /usr/local/include): the NCCL communicator's one-rank test is NOT built or run (apt-get install libnccl-dev to include it)."
say "tools: nvcc $("$NVCC" --version | tail -1), cmake $(cmake --version | head -1 | awk '{print $3}'), generator $GENERATOR, $JOBS jobs"

# ---- 3. configure + build --------------------------------------------------------------------------------------------
TB=$(date +%s)
BENCH_FLAG=OFF
[ $HAVE_BENCHMARK -eq 1 ] && BENCH_FLAG=ON
if ! cmake -S "$ROOT" -B "$BUILD_DIR" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_COMPILER="$NVCC" -DGRADCOMP_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
     -DGRADCOMP_WITH_MPI=OFF -DGRADCOMP_WITH_NCCL=$NCCL_FLAG -DGRADCOMP_WITH_PYTHON=OFF -DGRADCOMP_WERROR=OFF \
     -DGRADCOMP_BUILD_TESTS=ON -DGRADCOMP_BUILD_BENCH=$BENCH_FLAG > "$RESULTS/configure.log" 2>&1; then
  say "BUILD FAILED at configure: see $RESULTS/configure.log (last lines below)"
  tail -20 "$RESULTS/configure.log" | tee -a "$LOG"
  exit 2
fi
# The tests first (the library and every test the run needs); the benchmark is built after the tests ran.
targets=(gradcomp cuda_check_test codec_parity_reference_test canonical_nan_test)
for t in "$ROOT"/tests/gpu/*_gpu_test.cc; do
  name=$(basename "$t" .cc)
  [ $NCCL_FLAG = OFF ] && [[ "$name" == nccl_* ]] && continue
  targets+=("$name")
done
if ! cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" > "$RESULTS/build.log" 2>&1; then
  say "BUILD FAILED: see $RESULTS/build.log (last lines below)"
  tail -30 "$RESULTS/build.log" | tee -a "$LOG"
  exit 2
fi
BUILD_S=$(( $(date +%s) - TB ))
say "build: ${BUILD_S}s (${targets[*]})"

# ---- 4. tests --------------------------------------------------------------------------------------------------------
TEST_REGEX="_gpu_test\$|^cuda_check_test\$|^codec_parity_reference_test\$|^canonical_nan_test\$"
( cd "$BUILD_DIR" && timeout 420 ctest -R "$TEST_REGEX" --output-on-failure --timeout 360 ) \
  > "$RESULTS/ctest-gpu.log" 2>&1
CTEST_RC=$?
n_pass=$(grep -cE "Test +#[0-9]+: .* Passed" "$RESULTS/ctest-gpu.log")
n_skip=$(grep -cE "Test +#[0-9]+: .*Skipped" "$RESULTS/ctest-gpu.log")
n_fail=$(grep -cE "Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)|Test +#[0-9]+: .*Not Run" "$RESULTS/ctest-gpu.log")
TEST_SUMMARY="$n_pass passed, $n_fail failed, $n_skip skipped (CTest executables)"
FAILED_TESTS=$(grep -hE "^\[  FAILED  \] [A-Za-z]" "$RESULTS/ctest-gpu.log" | sed 's/\[  FAILED  \] //; s/ (.*//' | sort -u | head -20)
TEST_RC=0
# A GPU is present, so a skipped gpu test means the device was unusable: that fails the check too.
if [ $CTEST_RC -ne 0 ] || [ "$n_fail" -gt 0 ] || [ "$n_skip" -gt 0 ]; then TEST_RC=1; fi
if [ "$n_skip" -gt 0 ]; then
  why=$("$BUILD_DIR/tests/gpu/codec_parity_gpu_test" 2>&1 | head -1)
  say "WARNING: gpu tests were SKIPPED although nvidia-smi sees a GPU: $why"
fi
say "tests: ${TEST_SUMMARY:-no summary, see ctest-gpu.log}"

# ---- 5. benchmarks ---------------------------------------------------------------------------------------------------
BENCH_TXT="$RESULTS/bench.txt"
TORCH_LINE=""
BENCH_EXE="$BUILD_DIR/bench/kernels/compressors_bench_cuda"
DEVICE_PATH_EXE="$BUILD_DIR/bench/comm/device_path_bench"
BENCH_BUILD_RC=0
if [ $BENCH -eq 1 ]; then
  if [ $BENCH_FLAG = ON ]; then
    cmake --build "$BUILD_DIR" -j "$JOBS" --target compressors_bench_cuda device_path_bench \
      > "$RESULTS/build-bench.log" 2>&1 || BENCH_BUILD_RC=2
  else
    # Without Google Benchmark the bench directory is not configured: compile the (plain) benches by hand.
    mkdir -p "$BUILD_DIR/bench/kernels" "$BUILD_DIR/bench/comm"
    for pair in "kernels/compressors_bench_cuda:$BENCH_EXE" "comm/device_path_bench:$DEVICE_PATH_EXE"; do
      c++ -std=c++20 -O2 -I"$ROOT" -I"$ROOT/include" -I"$BUILD_DIR/generated/include" -I"$CUDA_HOME/include" \
        "$ROOT/bench/${pair%%:*}.cc" -o "${pair#*:}" -L"$BUILD_DIR" -lgradcomp -lfmt \
        -L"$CUDA_HOME/lib64" -lcudart -Wl,-rpath,"$BUILD_DIR:$CUDA_HOME/lib64" >> "$RESULTS/build-bench.log" 2>&1 \
        || BENCH_BUILD_RC=2
    done
  fi
  if [ $BENCH_BUILD_RC -ne 0 ]; then
    say "BENCHMARK BUILD FAILED (the tests above ran): see $RESULTS/build-bench.log (last lines below)"
    tail -20 "$RESULTS/build-bench.log" | tee -a "$LOG"
    BENCH=0
  fi
fi
if [ $BENCH -eq 1 ]; then
  sizes=64M,256M; reps=5
  [ $QUICK -eq 1 ] && sizes=64M && reps=3
  timeout 300 "$BENCH_EXE" --sizes "$sizes" --reps "$reps" --csv "$RESULTS/bench.csv" > "$BENCH_TXT" 2>&1 \
    || say "benchmark exited with $? (see $BENCH_TXT)"
  if command -v python3 >/dev/null 2>&1 && python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
       >/dev/null 2>&1; then
    TORCH_LINE=$(timeout 120 python3 "$ROOT/bench/gpu/torch_topk.py" --numel 64M --ratio 0.01 2>&1 | tail -1)
    echo "$TORCH_LINE" >> "$BENCH_TXT"
  else
    TORCH_LINE="torch_topk: no CUDA PyTorch here (peer not measured)"
  fi
  # The fused device path: Runtime on CUDA tensors over NCCL (one rank), GB/s of gradient per step, #wrong vs host.
  DEVICE_PATH_TXT="$RESULTS/device_path.txt"
  numel=25e6; [ $QUICK -eq 1 ] && numel=5e6
  timeout 180 "$DEVICE_PATH_EXE" --device cuda --numel "$numel" --tensors 50 --steps 5 > "$DEVICE_PATH_TXT" 2>&1 \
    || say "device_path_bench exited with $? (see $DEVICE_PATH_TXT)"
  # A DistributedOptimizer step on CUDA parameters, when this machine has a CUDA PyTorch and nanobind to build the
  # Python module with (the device machine reaches no package index).
  OPTIMIZER_LINE="optimizer_step: no CUDA PyTorch with nanobind here (not measured)"
  COLLECTIVES_LINE="python collectives on CUDA tensors: no CUDA PyTorch with nanobind here (not run)"
  if command -v python3 >/dev/null 2>&1 && python3 -c "import torch, nanobind, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
       >/dev/null 2>&1; then
    if cmake -S "$ROOT" -B "$BUILD_DIR" -DGRADCOMP_WITH_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
         >> "$RESULTS/configure.log" 2>&1 && cmake --build "$BUILD_DIR" -j "$JOBS" --target _gradcomp \
         > "$RESULTS/build-python.log" 2>&1; then
      OPTIMIZER_LINE=$(PYTHONPATH="$BUILD_DIR/python" timeout 120 python3 "$ROOT/bench/gpu/optimizer_step.py" 2>&1 | tail -1)
      # The Python collectives on CUDA tensors (tests/python/test_cuda_collectives.py, called without pytest).
      if PYTHONPATH="$BUILD_DIR/python:$ROOT/tests/python" timeout 120 python3 -c \
           "import test_cuda_collectives as t; t.test_python_collectives_on_cuda_tensors()" \
           > "$RESULTS/cuda-collectives.log" 2>&1; then
        COLLECTIVES_LINE="python collectives on CUDA tensors: passed"
      else
        COLLECTIVES_LINE="python collectives on CUDA tensors: FAILED (see cuda-collectives.log)"
      fi
    else
      OPTIMIZER_LINE="optimizer_step: the Python module did not build (see build-python.log)"
      COLLECTIVES_LINE="python collectives on CUDA tensors: the Python module did not build (not run)"
    fi
  fi
fi

# ---- 6. the table ----------------------------------------------------------------------------------------------------
{
  echo
  echo "==== gradcomp GPU check: $GPU_NAME (sm_$ARCH), $(date -u '+%Y-%m-%d'), build ${BUILD_S}s, total $(( $(date +%s) - T0 ))s ===="
  echo "tests: ${TEST_SUMMARY:-see ctest-gpu.log}"
  [ -n "$FAILED_TESTS" ] && echo "failed: $(echo "$FAILED_TESTS" | tr '\n' ' ')"
  if [ -s "$RESULTS/bench.csv" ]; then
    printf '%-28s %10s %10s %10s %8s  %s\n' spec numel comp_ms decomp_ms of_copy target
    torch_ms=$(echo "$TORCH_LINE" | sed -n 's/.* ms=\([0-9.]*\).*/\1/p')
    tail -n +2 "$RESULTS/bench.csv" | while IFS=, read -r spec numel bytes cms dms copyms gbps copygbps frac; do
      codec=${spec%%:*}
      target="-"
      case "$codec" in
        fp16|bf16|qsgd|terngrad|onebit) target=$(awk -v f="$frac" 'BEGIN{print (f>=0.70?"ok (>=0.70)":"MISS (<0.70)")}') ;;
        dgc) target=$(awk -v f="$frac" 'BEGIN{print (f>=0.40?"ok (>=0.40)":"MISS (<0.40)")}') ;;
        topk)
          if [ "$numel" = 67108864 ] && [ -n "$torch_ms" ] && [[ "$spec" != *exact=off* ]]; then
            target=$(awk -v c="$cms" -v t="$torch_ms" 'BEGIN{printf "%.1fx torch.topk (%s)", t/c, (t/c>=3?"ok":"MISS <3x")}')
          fi ;;
      esac
      printf '%-28s %10s %10s %10s %8s  %s\n' "$spec" "$numel" "$cms" "$dms" "$frac" "$target"
    done
    echo "copy: $(tail -n +2 "$RESULTS/bench.csv" | head -1 | cut -d, -f8) GB/s device-to-device (read+write), same run"
    [ -n "$TORCH_LINE" ] && echo "$TORCH_LINE"
  else
    if [ $BENCH_BUILD_RC -ne 0 ]; then echo "benchmark: not built (see build-bench.log)"; else echo "benchmark: no results (see bench.txt)"; fi
  fi
  if [ -s "${DEVICE_PATH_TXT:-/nonexistent}" ]; then
    echo "fused device path (device_path_bench; GB/s of gradient per step, #wrong vs the host path):"
    grep -E "^(device|cuda) " "$DEVICE_PATH_TXT"
  fi
  [ -n "${OPTIMIZER_LINE:-}" ] && echo "$OPTIMIZER_LINE"
  [ -n "${COLLECTIVES_LINE:-}" ] && echo "$COLLECTIVES_LINE"
  [ $NCCL_FLAG = OFF ] && echo "nccl: not built (no nccl.h): the NCCL one-rank test did not run"
} | tee -a "$LOG"
[ $TEST_RC -ne 0 ] && exit $TEST_RC
exit $BENCH_BUILD_RC
